"""TLS from the files a mounted Secret provides (``tls.crt``, ``tls.key``), reloaded without restart.

Kubernetes updates a mounted Secret by swapping a symlink, which sends no inotify event one can rely
on, so the files' digest is polled. A reload builds a complete new context and switches to it only
when the files did not change while it was read; new connections pick it from the SNI callback
(which OpenSSL calls with or without a server name), so a handshake never sees half a rotation.
Connections already open keep the certificate they started with.
"""

import asyncio
import hashlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from webhook.errors import ConfigError

log = logging.getLogger(__name__)
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"


class CertStore:
    def __init__(
        self, cert_dir: Path, client_ca: Path | None = None, on_reload: Callable[[], None] = lambda: None
    ) -> None:
        self.cert, self.key, self.client_ca = cert_dir / CERT_FILE, cert_dir / KEY_FILE, client_ca
        self.on_reload = on_reload
        self.digest = self._digest()
        self.current = self._context()
        self.expires = _not_after(self.cert)
        self.reloads = 0
        # The context the server listens with: it only hands each handshake the current one.
        self.listening = self.current
        self.listening.sni_callback = self._pick

    def _pick(self, connection: ssl.SSLObject, _name: str | None, _ctx: ssl.SSLContext) -> None:
        if connection.context is not self.current:
            connection.context = self.current

    def _files(self) -> list[Path]:
        return [self.cert, self.key, *([self.client_ca] if self.client_ca else [])]

    def _digest(self) -> str:
        digest = hashlib.sha256()
        try:
            for path in self._files():
                digest.update(path.read_bytes())
        except OSError as exc:
            raise ConfigError(f"cannot read certificate files: {exc}") from exc
        return digest.hexdigest()

    def _context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
            if self.client_ca is not None:
                context.load_verify_locations(cafile=self.client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"unusable certificate files in {self.cert.parent}: {exc}") from exc
        return context

    def reload_if_changed(self) -> bool:
        """Switch to the files on disk if they changed and form a usable pair; True if switched."""
        try:
            digest = self._digest()
            if digest == self.digest:
                return False
            context = self._context()
            expires = _not_after(self.cert)
            if self._digest() != digest:  # rotated while we read: take it on the next poll
                return False
        except ConfigError as exc:
            log.warning("certificate reload skipped, still serving the previous one: %s", exc)
            return False
        if self.client_ca is not None:
            context.verify_mode = ssl.CERT_REQUIRED
        self.current, self.digest, self.expires = context, digest, expires
        self.reloads += 1
        self.on_reload()
        log.info("certificate reloaded", extra={"cert": str(self.cert), "expires": expires})
        return True

    async def watch(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()


def _not_after(path: Path) -> float:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc.timestamp()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a PEM certificate: {exc}") from exc
