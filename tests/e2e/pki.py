"""Throw-away certificates for a local control plane and the webhook (``python -m tests.e2e.pki DIR``).

One CA signs: the kube-apiserver serving certificate, an admin client certificate
(``O=system:masters``), and the webhook serving certificate (IP SAN 127.0.0.1, which the API
server requires: it ignores the CN). A separate RSA key signs service-account tokens. The builders
are the product's own (``webhook.tools.devcerts``).
"""

import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from webhook.tools import devcerts

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
LOCAL = ("localhost", "127.0.0.1")


def ensure_pki(directory: Path) -> Path:
    """Create the certificates in ``directory`` unless they are all there already."""
    directory.mkdir(parents=True, exist_ok=True)
    if all((directory / f).exists() for f in FILES):
        return directory
    ca, ca_key = devcerts.make_ca()
    out = {"ca.crt": devcerts.pem_cert(ca), "ca.key": devcerts.pem_key(ca_key)}
    out["apiserver.crt"], out["apiserver.key"] = devcerts.issue(
        ca, ca_key, devcerts.name("kube-apiserver"), names=LOCAL
    )
    out["admin.crt"], out["admin.key"] = devcerts.issue(
        ca, ca_key, devcerts.name("cardquota-admin", "system:masters"), client=True
    )
    out["webhook.crt"], out["webhook.key"] = devcerts.issue(
        ca, ca_key, devcerts.name("cardquota-webhook"), names=LOCAL
    )
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    out["sa.key"] = devcerts.pem_key(sa)
    out["sa.pub"] = sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for file_name, data in out.items():
        devcerts.write(directory / file_name, data)
    return directory


if __name__ == "__main__":
    print(ensure_pki(Path(sys.argv[1] if len(sys.argv) > 1 else "certs")))
