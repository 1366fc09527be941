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
    # Other nodes of the same broker (a RabbitMQ cluster), tried in turn when this one does not
    # answer: ``--upstream-stomp stomp://a:61613,stomp://b:61613``.
    alternates: tuple[Endpoint, ...] = ()

    def __str__(self) -> str:
        return ",".join(f"{e.host}:{e.port}" for e in self.every())

    def every(self) -> tuple[Endpoint, ...]:
        """This node and its alternates, in the order to try them (each without alternates)."""
        if not self.alternates:
            return (self,)
        first = Endpoint(self.host, self.port, self.user, self.password, self.vhost, self.tls,
                         self.ca_file)
        return (first, *self.alternates)
