"""STOMP frames <-> the interception core's views and decisions.

``Screen`` compiles the chain's ``Interest`` into byte searches once, so a frame nobody asked to
see costs a few substring searches of its header section and is never decoded. ``Consumers``
remembers, only when an interceptor asked for settlements, which deliveries each subscription
still owes an ACK or NACK for, so that a NACK, the ABORT of a transaction that settled
deliveries, and a lost connection can be offered as ``Settle`` views with what they settle.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from bridge.frontends.lazy_headers import LazyHeaders
from bridge.frontends.stomp.escaping import escape, unescape, unescape_table
from bridge.frontends.stomp.frame import Frame, serialize
from bridge.frontends.stomp.header_decoding import ESCAPES
from bridge.intercept.chain import Interest
from bridge.intercept.decisions import Copy, Relay, Rewrite
from bridge.intercept.views import Delivery, Principal, Send, Settle, Settlement, Subscribe

SETTLING = ("ACK", "NACK", "COMMIT", "ABORT")


def headers_of(frame: Frame) -> dict[str, str]:
    """A frame's headers, the first of a repeated one winning (STOMP 1.2)."""
    return dict(reversed(frame.headers))  # the last assignment is the first occurrence


class Screen:
    """Which client and broker frames the chain wants to see, decided on their bytes."""

    def __init__(self, interest: Interest) -> None:
        self.interest = interest
        needles = [b"\n" + name.encode() + b":" for name in sorted(interest.send_headers)]
        needles += [text.encode() for text in interest.send_mentions]
        self._needles = tuple(needles)
        commands = set()
        if interest.sends:
            commands.add("SEND")
        if interest.subscribes:
            commands.add("SUBSCRIBE")
        if interest.settlements:
            commands.update(("SUBSCRIBE", "UNSUBSCRIBE", "DISCONNECT", *SETTLING))
        self.client_commands = frozenset(commands)
        self.deliveries = interest.deliveries or interest.settlements

    def wants_send(self, frame: Frame) -> bool:
        """Whether some interceptor asked to see this SEND. Only the header section can name a
        header: the body is never searched (it can be large)."""
        raw, end = frame.raw, frame.body_at
        return any(raw.find(needle, 0, end) >= 0 for needle in self._needles)


def send_view(frame: Frame, principal: Principal) -> Send:
    headers = headers_of(frame)
    return Send(
        destination=headers.get("destination", ""),
        headers=headers,
        body_size=frame.body_length,
        principal=principal,
        transaction=headers.get("transaction"),
    )


def subscribe_view(frame: Frame, principal: Principal) -> Subscribe:
    return Subscribe(frame.get("destination") or "", principal)


_NEEDLES: dict[str, bytes] = {}


class FrameHeaders(LazyHeaders):
    """A MESSAGE's headers, read off its bytes one at a time: a delivery view costs a few
    substring searches, and the frame is decoded whole only when something iterates over it.
    ``table`` undoes the escapes of a value that has them (ActiveMQ escapes the colons of every
    message id); None takes backslashes as they stand (STOMP 1.0). First occurrence wins, as
    when decoded."""

    __slots__ = ("_frame", "_table")

    def __init__(self, frame: Frame, table: dict[str, str] | None = None) -> None:
        super().__init__()
        self._frame = frame
        self._table = table

    def get(self, name: str, default: Any = None) -> Any:
        if self._all is None:
            needle = _NEEDLES.get(name)
            if needle is None:
                needle = _NEEDLES.setdefault(name, b"\n" + name.encode() + b":")
            frame = self._frame
            raw, end = frame.raw, frame.body_at
            at = raw.find(needle, 0, end)
            if at < 0:
                return default
            start = at + len(needle)
            value = raw[start:raw.find(b"\n", start, end)]
            if b"\r" not in value:
                try:
                    text = value.decode()
                except UnicodeDecodeError:
                    pass
                else:
                    table = self._table
                    return unescape(text, table) if table is not None and "\\" in text else text
        return self._decoded().get(name, default)

    def _decode_all(self) -> dict[str, str]:
        return headers_of(self._frame)


# A backslash that starts no escape the version defines (``ESCAPES``, the codec's), once the
# escaped backslashes are taken out; 1.0 defines none: a backslash stands as it is.
_BAD_ESCAPE: dict[str | None, re.Pattern[bytes] | None] = {
    version: None if escape is None else re.compile(rb"\\(?!%s)" % escape[2:])
    for version, escape in ESCAPES.items()
}


def delivery_view(frame: Frame, version: str | None) -> Delivery:
    """A MESSAGE as a view. ASCII headers (the common case) are read off the bytes as needed;
    any others, and a head with an escape the version does not define, are decoded now, so a
    header the broker got wrong is found here (a protocol error the session reports) and not
    later, when a settlement reads it."""
    head = frame.raw[:frame.body_at]
    headers: Mapping[str, str]
    bad = _BAD_ESCAPE.get(version)
    if not head.isascii() or (
            bad is not None and b"\\" in head and bad.search(head.replace(b"\\\\", b""))):
        headers = headers_of(frame)
    else:
        headers = FrameHeaders(frame, unescape_table(version))
    return Delivery(
        destination=headers.get("destination", ""),
        subscription=headers.get("subscription", ""),
        ack_id=ack_id(headers, version),
        headers=headers,
        body_size=frame.body_length,
        redelivered=headers.get("redelivered") == "true",
    )


def ack_id(headers: Mapping[str, str], version: str | None) -> str:
    """What a client names a MESSAGE by in its ACK or NACK: STOMP 1.2 its ``ack`` header,
    earlier versions its ``message-id``."""
    if version == "1.2":
        return headers.get("ack") or headers.get("message-id", "")
    return headers.get("message-id", "")


def decision_bytes(decision: Relay | Rewrite, frame: Frame, version: str | None) -> bytes:
    """The bytes that carry a RELAY or a Rewrite of ``frame`` upstream."""
    if isinstance(decision, Rewrite):
        return serialize(frame.command, decision.headers, frame.body, version=version)
    return frame.raw


class Consumers:
    """What each subscription was handed and has not settled (the frames kept, so that a copy
    can be put in place of a failed delivery), and what each open transaction settled, so
    that settlements can be offered as views."""

    def __init__(self, requeues: Callable[[str | None], bool] | None = None) -> None:
        # How the broker reads a NACK's ``requeue`` header (RabbitMQ's plugin); None: it has
        # no such header (ActiveMQ), and every NACK is a failed delivery.
        self.requeues = requeues
        self.modes: dict[str, str] = {}  # subscription id -> ack mode
        self.sources: dict[str, str] = {}  # subscription id -> its destination
        # ack id -> the delivery and its frame, in delivery order
        self.unsettled: dict[str, tuple[Delivery, Frame]] = {}
        self.transactions: dict[str, list[tuple[Delivery, ...]]] = {}
        # Subscriptions whose UNSUBSCRIBE failed their deliveries, held until the copies are in.
        self.leaving: set[str] = set()
        self.last_taken: tuple[Delivery, Frame] | None = None

    def subscribed(self, frame: Frame) -> None:
        sub = _subscription(frame)
        self.modes[sub] = frame.get("ack") or "auto"
        self.sources[sub] = frame.get("destination") or ""

    def unsubscribing(self, frame: Frame, principal: Principal) -> Settle | None:
        """An UNSUBSCRIBE offered the first time: what its subscription was handed and has not
        settled (outside an open transaction) fails now, while the subscription is still there
        to take the ACKs of the originals (RabbitMQ refuses an ACK once it is gone, ActiveMQ
        has taken the message back). None when there is nothing, or it was offered already:
        the frame comes again once the copies are confirmed."""
        sub = _subscription(frame)
        if sub in self.leaving:
            return None
        pending = self._in_transactions()
        left = tuple(d for d, _ in self.unsettled.values()
                     if d.subscription == sub and d.ack_id not in pending)
        if not left:
            return None
        self.leaving.add(sub)
        return Settle(Settlement.LOST, left, None, principal)

    def unsubscribed(self, frame: Frame) -> None:
        """The UNSUBSCRIBE goes up: what its subscription still holds is the broker's again
        (ActiveMQ redelivers it at once, RabbitMQ when the connection ends)."""
        sub = _subscription(frame)
        self.leaving.discard(sub)
        self.modes.pop(sub, None)
        self.sources.pop(sub, None)
        pending = self._in_transactions()
        for name, (d, _) in list(self.unsettled.items()):
            if d.subscription == sub and name not in pending:
                del self.unsettled[name]

    def _in_transactions(self) -> set[str]:
        """Deliveries an open transaction settles: its COMMIT or ABORT decides."""
        return {d.ack_id for groups in self.transactions.values()
                for deliveries in groups for d in deliveries}

    def delivered(self, delivery: Delivery, frame: Frame) -> None:
        if self.modes.get(delivery.subscription, "auto") != "auto":
            # A failure is handled for the queue the subscription reads, which the MESSAGE's
            # destination (where it was sent: /exchange/x/key, say) need not name.
            source = self.sources.get(delivery.subscription, "")
            if source and source != delivery.destination:
                delivery = replace(delivery, source=source)
            self.unsettled[delivery.ack_id] = (delivery, frame)

    def settle(self, frame: Frame, version: str | None, principal: Principal) -> Settle | None:
        """The view of an ACK, NACK, COMMIT or ABORT; None for what settles nothing. An ACK or
        NACK inside a transaction settles only when the transaction commits. What an ACK
        settles is forgotten at once; what a failure names stays until ``take`` or
        ``forget``."""
        command, tx = frame.command, frame.get("transaction")
        if command in ("COMMIT", "ABORT"):
            done = self.transactions.pop(tx or "", [])
            if command == "COMMIT":
                self.forget(d for deliveries in done for d in deliveries)
                return None
            rolled = tuple(d for deliveries in done for d in deliveries)
            return Settle(Settlement.ROLLBACK, rolled, tx, principal) if rolled else None
        name = (frame.get("id") if version == "1.2" else frame.get("message-id")) or ""
        deliveries = tuple(self._covered(name))
        if tx is not None:
            self.transactions.setdefault(tx, []).append(deliveries)
            return None
        if command == "ACK":
            self.forget(deliveries)
            return Settle(Settlement.ACK, deliveries, None, principal)
        if self.requeues is not None and not self.requeues(frame.get("requeue")):
            # Not requeued: the broker drops or dead-letters them by the queue's own settings,
            # as for an AMQP Nack without requeue. It goes up as sent.
            self.forget(deliveries)
            return None
        return Settle(Settlement.NACK, deliveries, None, principal)

    def individual(self, frame: Frame, version: str | None) -> bool:
        """Whether an ACK or NACK names one unsettled delivery of a ``client-individual``
        subscription."""
        name = (frame.get("id") if version == "1.2" else frame.get("message-id")) or ""
        entry = self.unsettled.get(name)
        return entry is not None and self.modes.get(entry[0].subscription) == "client-individual"

    def lost(self, principal: Principal) -> Settle | None:
        """The connection ended: everything handed out and not settled (an ACK in a transaction
        that never committed settled nothing)."""
        self.transactions.clear()
        left = tuple(d for d, _ in self.unsettled.values())
        return Settle(Settlement.LOST, left, None, principal) if left else None

    def take(self, ack_id: str) -> tuple[Delivery, Frame] | None:
        """The unsettled delivery ``ack_id`` and its frame, forgotten: a copy replaces it."""
        self.last_taken = self.unsettled.pop(ack_id, None)
        return self.last_taken

    def forget(self, deliveries: Iterable[Delivery]) -> None:
        for d in deliveries:
            self.unsettled.pop(d.ack_id, None)

    def _covered(self, name: str) -> Iterator[Delivery]:
        """The deliveries one ACK or NACK settles: in ``client`` mode every earlier delivery of
        the same subscription as well (cumulative), else just the one named."""
        entry = self.unsettled.get(name)
        if entry is None:
            return
        named = entry[0]
        if self.modes.get(named.subscription) != "client":
            yield named
            return
        for d, _ in self.unsettled.values():
            if d.subscription == named.subscription:
                yield d
            if d is named:
                return


def _subscription(frame: Frame) -> str:
    """The subscription a SUBSCRIBE or UNSUBSCRIBE names (STOMP 1.0: id optional)."""
    return frame.get("id") or frame.get("destination") or ""


def stamped(frame: Frame, headers: tuple[tuple[str, str], ...], version: str | None) -> bytes:
    """``frame``'s bytes with ``headers`` added first (so they win over any of the same name),
    without re-encoding the rest."""
    raw = frame.raw
    cut = raw.index(b"\n") + 1
    added = "".join(
        f"{name}:{value}\n" if _PLAIN(name + value) else
        f"{escape(name, version, name=True)}:{escape(value, version)}\n"
        for name, value in headers
    )
    return b"".join((raw[:cut], added.encode(), raw[cut:]))


_PLAIN = re.compile(r"[^:\r\n\\\0]*").fullmatch


def copy_frame(
    copy: Copy, original: tuple[Delivery, Frame], receipt: str, version: str | None,
) -> bytes:
    """The SEND that puts ``copy`` with the original delivery's body, asking for a receipt."""
    frame = original[1]
    body = frame.body
    headers = [("destination", copy.destination or "")]
    headers += [(n, v) for n, v in copy.headers if n != "destination"]
    if frame.get("content-length") is not None:  # a bytes message stays one (ActiveMQ)
        headers.append(("content-length", str(len(body))))
    headers.append(("receipt", receipt))
    return serialize("SEND", headers, body, version=version)


def ack_frame(
    original: tuple[Delivery, Frame] | None, version: str | None, receipt: str | None = None,
) -> bytes:
    """The ACK of one delivery, named the way this STOMP version names it."""
    assert original is not None
    delivery = original[0]
    if version == "1.2":
        headers = [("id", delivery.ack_id)]
    elif version == "1.1":
        headers = [("message-id", delivery.ack_id), ("subscription", delivery.subscription)]
    else:
        headers = [("message-id", delivery.ack_id)]
    if receipt is not None:
        headers.append(("receipt", receipt))
    return serialize("ACK", headers, version=version)
