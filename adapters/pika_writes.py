"""One socket write for many AMQP frames in pika.

pika queues every frame it marshals as its own buffer (a publish is three: method, header, body)
and its transport sends them one ``send`` call each. A settle batch of 500 moves was about 1,600
system calls, and on loopback each costs the kernel's whole TCP path: the staging engine spent
a fifth of its time in them. ``coalesce()`` joins the queued buffers, up to ``JOIN_LIMIT`` bytes
at a time, before pika's own loop sends them; what goes on the wire is unchanged.
"""

from __future__ import annotations

import collections
from typing import Any

from pika.adapters.utils import io_services_utils

JOIN_LIMIT = 256 * 1024

_Transport: Any = getattr(io_services_utils, "_AsyncTransportBase", None)


def _join_front(buffers: collections.deque[bytes]) -> None:
    """Replace the leading buffers, up to JOIN_LIMIT bytes in all, by their concatenation."""
    if len(buffers) < 2 or len(buffers[0]) >= JOIN_LIMIT:
        return
    parts, size = [], 0
    while buffers and size < JOIN_LIMIT:
        size += len(buffers[0])
        parts.append(buffers.popleft())
    buffers.appendleft(b"".join(parts))


def _produce(self: Any) -> None:
    """pika's ``_AsyncTransportBase._produce``, joining the front buffers before each send."""
    buffers = self._tx_buffers
    while buffers:
        _join_front(buffers)
        sent = self._sigint_safe_send(self._sock, buffers[0])
        chunk = buffers.popleft()
        if sent < len(chunk):
            buffers.appendleft(chunk[sent:])
        self._tx_buffered_byte_count -= sent


def coalesce() -> bool:
    """Make pika's transports join queued frames into fewer writes; False when this pika has
    no such transport (then nothing is changed)."""
    if not all(hasattr(_Transport, name) for name in ("_produce", "_sigint_safe_send")):
        return False
    _Transport._produce = _produce
    return True
