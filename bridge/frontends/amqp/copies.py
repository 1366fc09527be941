"""The bridge's own channel on a client's upstream connection: where the copies that replace a
consumer's failed deliveries are published, in confirm mode, as that client (its connection,
its credentials, its permissions).

The channel is the last one the broker allows: the client is told a ``channel_max`` one lower
(``ProxyConnection(reserve_channel=True)``), so it never uses it. Frames the broker sends on it
never reach the client. One copy at a time: publish, wait for the broker's confirm (a Return
first means unroutable), so that a failure names its copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pamqp import commands
from pamqp import frame as pframe

from adapters.rabbitmq_stomp import route
from bridge.frontends.amqp.assembler import Message
from bridge.frontends.amqp.builders import channel_close_ok, content_frames_of
from bridge.frontends.amqp.framer import Frame
from bridge.frontends.amqp.translate import property_values
from policies.errors import BridgeError

_B = commands.Basic
_CLOSE = commands.Channel.Close.index
_NACK = _B.Nack.index


class CopyFailed(BridgeError):
    """The broker did not take a copy (refused, nacked, returned unroutable, channel closed)."""

    def __init__(self, text: str, reply_code: int = 0) -> None:
        super().__init__(text)
        self.reply_code = reply_code


class CopyChannel:
    """Publishes copies on channel ``number`` of the client's upstream connection."""

    def __init__(self, number: int, write: Callable[[bytes], None],
                 frame_max: Callable[[], int]) -> None:
        self.number = number
        self._write = write
        self._frame_max = frame_max
        self._open = False
        self._waiter: asyncio.Future[Frame] | None = None
        self._returned: str | None = None
        self._declared: set[str] = set()

    # -- broker -> bridge ---------------------------------------------------------------------
    def receive(self, event: Frame | Message) -> bytes | None:
        """A frame (or a returned message) the broker sent on this channel; returns bytes to
        answer the broker with (a Close-Ok)."""
        if isinstance(event, Message):
            method: Any = event.method
            self._returned = f"{method.reply_code} {method.reply_text}"
            return None
        answer = None
        if event.type == 1 and event.method_index == _CLOSE:
            self._open = False
            close: Any = event.method
            self._fail(CopyFailed(f"{close.reply_code} {close.reply_text}", close.reply_code))
            answer = channel_close_ok(self.number)
        elif self._waiter is not None and not self._waiter.done() and event.type == 1:
            self._waiter.set_result(event)
        return answer

    def lost(self, why: str) -> None:
        """The upstream connection ended."""
        self._open = False
        self._fail(CopyFailed(why))

    def _fail(self, exc: CopyFailed) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    # -- bridge -> broker ---------------------------------------------------------------------
    async def _call(self, data: bytes) -> Frame:
        self._waiter = asyncio.get_running_loop().create_future()
        self._write(data)
        return await self._waiter

    async def _ensure_open(self) -> None:
        if self._open:
            return
        await self._call(pframe.marshal(commands.Channel.Open(), self.number))
        await self._call(pframe.marshal(commands.Confirm.Select(), self.number))
        self._open = True

    async def _declare(self, queue: str) -> None:
        """Declare a ``/queue/`` destination's queue durable, as RabbitMQ's STOMP plugin does
        on SEND; one that exists with other arguments is used as it is."""
        try:
            await self._call(pframe.marshal(
                commands.Queue.Declare(queue=queue, durable=True), self.number))
        except CopyFailed as exc:
            if exc.reply_code != 406:
                raise
            await self._ensure_open()
            await self._call(pframe.marshal(
                commands.Queue.Declare(queue=queue, passive=True), self.number))
        self._declared.add(queue)

    async def put(self, destination: str, headers: dict[str, str], body: bytes) -> None:
        """Publish one copy to a STOMP-form destination and wait for the broker's confirm;
        CopyFailed when it does not take it."""
        try:
            where = route(destination)
            values = property_values({n: v for n, v in headers.items() if n != "destination"})
            method = _B.Publish(exchange=where.exchange, routing_key=where.routing_key,
                                mandatory=where.queue)
            frames = pframe.marshal(method, self.number) + content_frames_of(
                self.number, values, body, self._frame_max())
        except (ValueError, TypeError) as exc:  # a destination or a property it cannot be
            raise CopyFailed(f"{destination}: {exc}") from None
        await self._ensure_open()
        if where.declare and where.routing_key not in self._declared:
            await self._declare(where.routing_key)
        self._returned = None
        reply = await self._call(frames)
        if reply.method_index == _NACK:
            raise CopyFailed(f"{destination}: the broker nacked the copy")
        if self._returned is not None:
            self._declared.discard(where.routing_key)
            raise CopyFailed(f"{destination}: returned unroutable ({self._returned})")
