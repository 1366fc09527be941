"""A link's connection to the broker, read as a protocol: the broker's bytes go to the link as
they arrive, with no stream buffer and no task to wake per read.

Deliveries are most of what a consumer's link carries, and a read of them through a
``StreamReader`` costs a copy into its buffer, a future set, a task woken and a copy out; here
``data_received`` hands them on where they land. The other way it behaves as a ``StreamWriter``
does for the link (``write``, ``drain`` while the socket's buffer is over its high-water mark,
``close``), and ``finished`` is the broker's end of the connection: its result once the broker
has closed it (or the connection was lost), an exception when handling its bytes failed. Once
the connection is closed, ``drain`` returns at once and writes go nowhere: the link is ending
through ``finished``, as a link whose broker is gone does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Upstream(asyncio.Protocol):
    """The broker's side of one link."""

    def __init__(self, received: Callable[[bytes], None]) -> None:
        self._received = received
        self.transport: asyncio.Transport | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writable = True
        self._drainers: list[asyncio.Future[None]] = []

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.finished.done():
            return  # handling failed before: what follows is not read
        try:
            self._received(data)
        except Exception as exc:  # noqa: BLE001 - the link ends, with it as the reason
            self.finished.set_exception(exc)
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._finish()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()
        self._writable = True
        self._wake()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self._wake()

    # as the link writes

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    @property
    def writable(self) -> bool:
        """False while the socket's buffer is over its high-water mark (``drain`` waits)."""
        return self._writable

    async def drain(self) -> None:
        """Return once the socket's buffer is below its high-water mark, or is closed."""
        if self._writable or self.transport is None or self.transport.is_closing():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drainers.append(waiter)
        await waiter

    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def _wake(self) -> None:
        drainers, self._drainers = self._drainers, []
        for waiter in drainers:
            if not waiter.done():
                waiter.set_result(None)
