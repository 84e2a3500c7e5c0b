"""Throw-away certificates for a local control plane and the webhook (``python -m tests.e2e.pki DIR``).

One CA signs: the kube-apiserver serving certificate, an admin client certificate
(``O=system:masters``), and the webhook serving certificate (IP SAN 127.0.0.1, which the API
server requires: it ignores the CN). A separate RSA key signs service-account tokens.
"""

import datetime
import ipaddress
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

FILES = (
    "ca.crt",
    "ca.key",
    "apiserver.crt",
    "apiserver.key",
    "admin.crt",
    "admin.key",
    "webhook.crt",
    "webhook.key",
    "sa.key",
    "sa.pub",
)


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, days: int
) -> x509.CertificateBuilder:
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


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    subject: x509.Name,
    *,
    server: bool,
    client: bool = False,
) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
        [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    )
    builder = (
        _builder(subject, ca_name, key, 365)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if server:
        sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def ensure_pki(directory: Path) -> Path:
    """Create the certificates in ``directory`` unless they are all there already."""
    directory.mkdir(parents=True, exist_ok=True)
    if all((directory / f).exists() for f in FILES):
        return directory
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("cardquota-dev-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key, 3650)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    out = {"ca.crt": ca.public_bytes(serialization.Encoding.PEM), "ca.key": _pem_key(ca_key)}
    out["apiserver.crt"], out["apiserver.key"] = _issue(ca_key, ca_name, _name("kube-apiserver"), server=True)
    out["admin.crt"], out["admin.key"] = _issue(
        ca_key, ca_name, _name("cardquota-admin", "system:masters"), server=False, client=True
    )
    out["webhook.crt"], out["webhook.key"] = _issue(ca_key, ca_name, _name("cardquota-webhook"), server=True)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    out["sa.key"] = _pem_key(sa)
    out["sa.pub"] = sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for name, data in out.items():
        path = directory / name
        path.write_bytes(data)
        if name.endswith(".key"):
            path.chmod(0o600)
    return directory


if __name__ == "__main__":
    print(ensure_pki(Path(sys.argv[1] if len(sys.argv) > 1 else "certs")))
