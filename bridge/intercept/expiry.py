"""A send's time to live, counted from the send: a send with a relative TTL (``expiration``,
RabbitMQ's style, which the broker keeps as it was sent) is stamped with its absolute expiry
(``jms-bridge-expires``), so that a copy the bridge makes of it later (a redelivery, a dead
letter) carries only what is left of it instead of starting it again. An absolute TTL
(``expires``) needs no stamp. A delayed send is the delay interceptor's: its staged copy
carries the expiry."""

from __future__ import annotations

from collections.abc import Callable

from bridge.intercept.chain import Interceptor, Interest
from bridge.intercept.clock import wall_ms_ceil
from bridge.intercept.decisions import RELAY, Decision, Stamp
from bridge.intercept.views import Send
from bridge.staging.envelope import EXPIRES
from policies.delay import RELATIVE_TTL_HEADER

_MAX_DIGITS = 15  # ~30,000 years of ms: longer is not a TTL worth counting down


class ExpiryStamp(Interceptor):
    """Stamps the absolute expiry on a send that carries a relative TTL."""

    interest = Interest(send_headers=frozenset({RELATIVE_TTL_HEADER}))

    def __init__(self, clock: Callable[[], int] = wall_ms_ceil) -> None:
        self.clock = clock

    def on_send(self, send: Send) -> Decision:
        ttl = send.headers.get(RELATIVE_TTL_HEADER)
        if (not ttl or len(ttl) > _MAX_DIGITS or not ttl.isascii() or not ttl.isdigit()
                or int(ttl) == 0):
            return RELAY  # none, "0" (never), or not a TTL the broker would take either
        return Stamp(((EXPIRES, str(self.clock() + int(ttl))),))
