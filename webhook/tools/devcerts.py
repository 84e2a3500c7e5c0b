"""Development certificates: a CA and a serving certificate, as a mounted Secret lays them out.

``cardquota dev-certs DIR`` writes ``ca.crt``, ``ca.key``, ``tls.crt`` and ``tls.key`` (kept if
they are there and still valid for the asked names), for ``make run`` and for running the webhook
outside a cluster. The serving certificate names 127.0.0.1, localhost and the chart's Service.
"""

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from webhook.errors import ConfigError

SERVICE = "card-quota-webhook"
NAMESPACE = "card-quota-system"
DEFAULT_NAMES = (
    "127.0.0.1",
    "localhost",
    SERVICE,
    f"{SERVICE}.{NAMESPACE}",
    f"{SERVICE}.{NAMESPACE}.svc",
    f"{SERVICE}.{NAMESPACE}.svc.cluster.local",
)
Key = ec.EllipticCurvePrivateKey


def name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def pem_key(key: Key | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _builder(subject: x509.Name, issuer: x509.Name, key: Key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def make_ca(common_name: str = "cardquota-dev-ca", days: int = 3650) -> tuple[x509.Certificate, Key]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = name(common_name)
    cert = (
        _builder(subject, subject, key, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _san(entry: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(entry))
    except ValueError:
        return x509.DNSName(entry)


def issue(
    ca: x509.Certificate,
    ca_key: Key,
    subject: x509.Name,
    *,
    names: Sequence[str] = (),
    client: bool = False,
    days: int = 365,
) -> tuple[bytes, bytes]:
    """A leaf certificate and its key, PEM; ``names`` (IPs or DNS names) make it a server cert."""
    key = ec.generate_private_key(ec.SECP256R1())
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if names else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        _builder(subject, ca.subject, key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
    return pem_cert(builder.sign(ca_key, hashes.SHA256())), pem_key(key)


def write(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    if path.suffix == ".key":
        path.chmod(0o600)


def ensure_dev_certs(directory: Path, names: Sequence[str] = DEFAULT_NAMES) -> Path:
    """``ca.crt``/``ca.key`` and a serving ``tls.crt``/``tls.key`` for ``names``; reuses valid ones."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_crt, ca_key_file = directory / "ca.crt", directory / "ca.key"
    if ca_crt.exists() and ca_key_file.exists():
        ca = x509.load_pem_x509_certificate(ca_crt.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key_file.read_bytes(), None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{ca_key_file}: expected an EC private key")
        ca_key = loaded
    else:
        ca, ca_key = make_ca()
        write(ca_crt, pem_cert(ca))
        write(ca_key_file, pem_key(ca_key))
    if not _serves(directory / "tls.crt", ca, names):
        cert, key = issue(ca, ca_key, name(SERVICE), names=names)
        write(directory / "tls.key", key)
        write(directory / "tls.crt", cert)
    return directory


def _serves(path: Path, ca: x509.Certificate, names: Sequence[str]) -> bool:
    if not path.exists() or not (path.parent / "tls.key").exists():
        return False
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    if cert.not_valid_after_utc < datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1):
        return False
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    have = {str(v) for v in sans.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    return set(names) <= have
