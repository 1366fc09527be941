"""Where a broker or a listener is: a plain value shared by the application and the adapters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    user: str | None = None
    password: str | None = None
    vhost: str | None = None
    # Reached over TLS (stomp+ssl://, amqps://), verified against ``ca_file`` when one is named,
    # else against the system's CAs.
    tls: bool = False
    ca_file: str | None = None

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"
