"""A review that reaches a replica which does not decide goes to the one that does (the Lease holder).

Every replica serves with the certificate of one Secret, so a replica checks the leader's
certificate against the CA beside its own (``ca.crt``, else the certificate itself when it is
self-signed) under a name its own certificate carries; with ``--client-ca`` it presents its own
certificate as a client. A forwarded review carries ``FORWARDED_HEADER`` and is never forwarded
again: a replica that receives one and does not decide answers 503, and the forwarder tries again
as soon as the Lease names a holder, until its deadline. So a review fails only when no replica
held the Lease for the whole wait.
"""

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp
from cryptography import x509

from webhook.errors import ConfigError, NotReady

log = logging.getLogger(__name__)
FORWARDED_HEADER = "X-Cardquota-Forwarded"
POLL_SECONDS = 0.02  # while no replica decides: how often the Lease's holder is looked at again
CONNECT_SECONDS = 1.0


class Unreachable(Exception):
    """The leader could not be asked (refused, reset, timed out, TLS failure)."""


class Forwarder:
    """One keep-alive connection pool to whichever replica leads."""

    def __init__(self, cert: Path, key: Path, ca: Path | None, present_cert: bool) -> None:
        self.cert, self.key, self.present_cert = cert, key, present_cert
        self.ca = ca if ca is not None and ca.exists() else (cert.parent / "ca.crt")
        if not self.ca.exists():
            self.ca = cert
        self.server_name = _first_name(cert)
        self._context = self._make_context()
        self._session: aiohttp.ClientSession | None = None

    def _make_context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=str(self.ca))
            if self.present_cert:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot forward reviews: unusable CA or certificate {self.ca}: {exc}") from exc
        return context

    async def send(self, address: str, path: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        """POST ``body`` to ``https://address/path``: the leader's status and answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        headers = {FORWARDED_HEADER: "1", "Content-Type": "application/json"}
        limit = aiohttp.ClientTimeout(total=timeout, connect=min(CONNECT_SECONDS, timeout))
        try:
            async with self._session.post(
                f"https://{address}{path}",
                data=body,
                headers=headers,
                ssl=self._context,
                server_hostname=self.server_name,
                timeout=limit,
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:  # ValueError: a bad address
            raise Unreachable(f"{address}: {exc!r}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


async def relay(
    forwarder: Forwarder,
    decides: Callable[[], bool],
    leader: Callable[[], str | None],
    path: str,
    body: bytes,
    wait: float,
) -> tuple[int, bytes] | None:
    """The leader's answer to ``body``; None as soon as this replica decides itself. Waits up to
    ``wait`` seconds for a leader (a handover, a crash) and raises ``NotReady`` after that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    why = "no replica holds the lease"
    while True:
        if decides():
            return None
        address, left = leader(), deadline - loop.time()
        if address and left > 0:
            try:
                status, answer = await forwarder.send(address, path, body, left)
            except Unreachable as exc:
                why = f"the leader at {exc}"
            else:
                if status != 503:
                    return status, answer
                why = f"the replica at {address} does not decide (a handover)"
        elif not address:
            why = "no replica holds the lease"
        if loop.time() >= deadline:
            raise NotReady(f"no leader answered within {wait:g} s: {why}")
        await asyncio.sleep(POLL_SECONDS)


def _first_name(cert: Path) -> str:
    """A name the serving certificate carries (its first DNS or IP SAN): the leader's certificate
    comes from the same Secret, so it carries it too."""
    try:
        loaded = x509.load_pem_x509_certificate(cert.read_bytes())
        sans = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound) as exc:
        raise ConfigError(f"cannot forward reviews: {cert} names no host: {exc}") from exc
    names = [str(n) for n in sans.get_values_for_type(x509.DNSName)]
    names += [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    if not names:
        raise ConfigError(f"cannot forward reviews: {cert} has no DNS or IP subject alternative name")
    return names[0]
