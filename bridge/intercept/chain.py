"""Interceptors and the chain a front-end offers its views to.

An interceptor states its ``Interest`` up front, in protocol-neutral terms, so that a front-end
can screen its traffic cheaply in its own wire format (the STOMP front-end searches a SEND's
header bytes; nothing is decoded for a frame nobody wants) and build views only for what some
interceptor asked to see. The chain offers a view to its interceptors in order; the first
decision other than ``RELAY`` is the chain's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

from bridge.intercept.decisions import RELAY, Decision
from bridge.intercept.views import Delivery, Send, Settle, Subscribe


@dataclass(frozen=True, slots=True)
class Interest:
    """Which views an interceptor wants to be offered."""

    send_headers: frozenset[str] = frozenset()  # sends that carry one of these headers
    send_mentions: tuple[str, ...] = ()  # sends with a header value containing one of these
    subscribes: bool = False
    deliveries: bool = False
    settlements: bool = False
    # What a delivery decision may depend on besides the ``redelivered`` flag: these headers.
    # An interceptor that wants deliveries decides the same for every delivery that is not
    # redelivered and carries none of them, so a front-end may take that decision once
    # (``Chain.plain_delivery``) and apply it to such deliveries without a view of each.
    delivery_headers: frozenset[str] = frozenset()
    # A delivery decision that depends on the delivery's destination too: then there is no one
    # decision for plain deliveries (``Chain.plain_delivery`` is None).
    delivery_destinations: bool = False

    def __or__(self, other: Interest) -> Interest:
        return Interest(
            self.send_headers | other.send_headers,
            tuple(dict.fromkeys((*self.send_mentions, *other.send_mentions))),
            self.subscribes or other.subscribes,
            self.deliveries or other.deliveries,
            self.settlements or other.settlements,
            self.delivery_headers | other.delivery_headers,
            self.delivery_destinations or other.delivery_destinations,
        )

    @property
    def sends(self) -> bool:
        return bool(self.send_headers or self.send_mentions)


class Interceptor:
    """Base of the interceptors: every hook relays. A subclass states its ``interest`` and
    overrides the hooks for the views it asked for."""

    interest = Interest()

    def on_send(self, send: Send) -> Decision:
        return RELAY

    def on_subscribe(self, subscribe: Subscribe) -> Decision:
        return RELAY

    def on_delivery(self, delivery: Delivery) -> Decision:
        return RELAY

    def on_settle(self, settle: Settle) -> Decision:
        return RELAY


class Chain(Interceptor):
    """Interceptors in order; the first decision that is not ``RELAY`` wins."""

    def __init__(self, interceptors: Sequence[Interceptor] = ()) -> None:
        self.interceptors = tuple(interceptors)
        interest = Interest()
        for icpt in self.interceptors:
            interest |= icpt.interest
        self.interest = interest
        self._sends = [i for i in self.interceptors if i.interest.sends]
        self._subscribes = [i for i in self.interceptors if i.interest.subscribes]
        self._deliveries = [i for i in self.interceptors if i.interest.deliveries]
        self._settlements = [i for i in self.interceptors if i.interest.settlements]

    def on_send(self, send: Send) -> Decision:
        for icpt in self._sends:
            decision = icpt.on_send(send)
            if decision is not RELAY:
                return decision
        return RELAY

    def on_subscribe(self, subscribe: Subscribe) -> Decision:
        for icpt in self._subscribes:
            decision = icpt.on_subscribe(subscribe)
            if decision is not RELAY:
                return decision
        return RELAY

    def on_delivery(self, delivery: Delivery) -> Decision:
        for icpt in self._deliveries:
            decision = icpt.on_delivery(delivery)
            if decision is not RELAY:
                return decision
        return RELAY

    def plain_delivery(self) -> Decision | None:
        """The decision for any delivery that is not redelivered and carries none of the
        interest's ``delivery_headers`` (see ``Interest``); None when it depends on the
        delivery's destination."""
        if self.interest.delivery_destinations:
            return None
        return self.on_delivery(_PLAIN_DELIVERY)

    def on_settle(self, settle: Settle) -> Decision:
        for icpt in self._settlements:
            decision = icpt.on_settle(settle)
            if decision is not RELAY:
                return decision
        return RELAY



# Any delivery that is not redelivered and has none of the headers its interceptors name.
_PLAIN_DELIVERY = Delivery("", "", "", MappingProxyType({"redelivered": "false"}), 0, False)
