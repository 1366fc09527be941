"""Helpers shared by the AMQP unit tests: frames built by pamqp or by hand, and h11-style
feeding (whole, one byte at a time, with trailing data)."""

from __future__ import annotations

import random
import struct
from typing import Any

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

from bridge.frontends.amqp import NEED_DATA, PROTOCOL_HEADER, AmqpProtocolError, Framer

HEADER = PROTOCOL_HEADER


def method(value: Any, channel: int = 0) -> bytes:
    return pframe.marshal(value, channel)


def raw_frame(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def content_header(
    channel: int, size: int, props: commands.Basic.Properties | None = None
) -> bytes:
    return pframe.marshal(pheader.ContentHeader(0, size, props), channel)


def body(channel: int, data: bytes) -> bytes:
    return pframe.marshal(pbody.ContentBody(data), channel)


def publish(channel: int, data: bytes, props: commands.Basic.Properties | None = None,
            routing_key: str = "q") -> bytes:
    return (
        method(commands.Basic.Publish(exchange="", routing_key=routing_key), channel)
        + content_header(channel, len(data), props)
        + (body(channel, data) if data else b"")
    )


HEARTBEAT = raw_frame(8, 0, b"")


def random_chunks(data: bytes, rng: random.Random,
                  sizes: tuple[int, ...] = (1, 7, 64, 1000, 5000, 50_000)) -> list[bytes]:
    """``data`` cut into pieces of sizes drawn from ``sizes``, as reads may cut a stream."""
    out, at = [], 0
    while at < len(data):
        step = rng.choice(sizes)
        out.append(data[at:at + step])
        at += step
    return out


def chunked(data: bytes, mode: str) -> list[bytes]:
    if mode == "whole":
        return [data]
    if mode == "bytewise":
        return [data[i : i + 1] for i in range(len(data))]
    raise ValueError(mode)


def run(framer: Framer, chunks: list[bytes]) -> list[Any]:
    """Events' raw bytes for chunks fed through receive_data/next_event; an error ends the
    list as ("error", reply_code)."""
    out: list[Any] = []
    try:
        for chunk in chunks:
            framer.receive_data(chunk)
            while True:
                event = framer.next_event()
                if event is NEED_DATA:
                    break
                out.append(event.raw)  # type: ignore[union-attr]
    except AmqpProtocolError as exc:
        out.append(("error", exc.reply_code))
    return out
