"""TLS for the STOMP listener (``--stomp-tls-listen``) and towards the broker (``stomp+ssl://``,
``amqps://``).

The listener's context takes TLS 1.2 or later only. Its certificate and key (PEM) are read at
start, where a file that cannot be used ends the bridge with one line naming it, and read again
whenever either file changes on disk (cert-manager rotates them in place): the same context
object is loaded again, so new connections get the new certificate and established ones keep
theirs. With ``--tls-client-ca`` a client must present a certificate signed by that CA (mutual
TLS); its subject is logged with the connection.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass

from bridge.app import logs
from policies.errors import ConfigError

RELOAD_EVERY_S = 2.0


def _stamp(path: str) -> tuple[int, int, int]:
    """What changes when a file is replaced or rewritten (a Secret's symlink swap too)."""
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def server_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """The listener's context; ConfigError naming the file and the reason when one is unusable."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # No TLS 1.3 session tickets: a client that reads its socket on one thread while it writes
    # on another (stomp.py: a receiver thread from the start) can lose its first frame when a
    # ticket arrives as it writes CONNECT (here: 4 of 550 connections under load, the bridge
    # then saw no CONNECT; 0 of 1,100 without tickets). Messaging connections live long; a
    # reconnect does a full handshake.
    ctx.num_tickets = 0
    _load_pair(ctx, cert, key)
    if client_ca is not None:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-client-ca {client_ca}: cannot load it: {_why(exc)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca_file: str | None) -> ssl.SSLContext:
    """Towards the broker: its certificate verified against ``ca_file`` (else the system's CAs)
    and its host name checked."""
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--upstream-ca {ca_file}: cannot load it: {_why(exc)}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(getattr(exc, "reason", None) or exc)


def _load_pair(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: cannot read it: {_why(exc)}") from None
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: not a usable PEM certificate "
                          f"and matching key: {_why(exc)}") from None


@dataclass
class CertFiles:
    """The listener's certificate and key, loaded again into its context when they change."""

    ctx: ssl.SSLContext
    cert: str
    key: str
    reloads: int = 0

    def __post_init__(self) -> None:
        self._seen = self._stamps()

    def _stamps(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            return (_stamp(self.cert), _stamp(self.key))
        except OSError:
            return None

    def check(self) -> bool:
        """Load the files again if they changed; True when they were. A pair that cannot be
        used (half written, key and certificate not matching yet) is logged and the old one
        kept; it is tried again when the files change again."""
        now = self._stamps()
        if now is None or now == self._seen:
            return False
        self._seen = now
        log = logs.get("tls")
        try:
            _load_pair(self.ctx, self.cert, self.key)
        except ConfigError as exc:
            log.error("TLS certificate not reloaded; keeping the one in use", problem=str(exc))
            return False
        self.reloads += 1
        log.info("TLS certificate reloaded", cert=self.cert, key=self.key)
        return True

    async def watch(self, every: float = RELOAD_EVERY_S) -> None:
        while True:
            await asyncio.sleep(every)
            self.check()
