"""Frames parsed per second by bridge.frontends.stomp.FrameParser (the relay's codec cost).

Two typical frames: a client SEND of 1 KiB with 4 headers (validate=True, the client side) and a
broker MESSAGE of 1 KiB with 8 headers (validate=False, the broker side). Each is fed as 64 KiB
socket-sized chunks, the way the relay receives them, and also one frame per feed(); each
figure is the best of repeated runs over the given seconds, since a shared machine is noisy.

    .venv/bin/python bench/codec_micro.py [seconds-per-case]
"""

from __future__ import annotations

import sys
import time

from bridge.frontends.stomp import FrameParser, serialize

BODY = b"x" * 1024
SEND = serialize(
    "SEND",
    [
        ("destination", "/queue/orders.incoming"),
        ("content-type", "application/json"),
        ("content-length", str(len(BODY))),
        ("receipt", "r-000123"),
    ],
    BODY,
)
MESSAGE = serialize(
    "MESSAGE",
    [
        ("subscription", "sub-0"),
        ("destination", "/queue/orders.incoming"),
        ("message-id", "T_sub-0@@session-Yq8mvPsmRQ5fLx3vGvN0gA@@1@@42"),
        ("redelivered", "false"),
        ("ack", "T_sub-0@@session-Yq8mvPsmRQ5fLx3vGvN0gA@@1@@42"),
        ("content-type", "application/json"),
        ("persistent", "true"),
        ("content-length", str(len(BODY))),
    ],
    BODY,
)


def chunks(frame: bytes, size: int = 64 * 1024, total: int = 4 * 1024 * 1024) -> list[bytes]:
    """A stream of back-to-back frames cut at socket-read boundaries (frames split across)."""
    stream = frame * (total // len(frame))
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def rate(frame: bytes, *, role: str, validate: bool, chunked: bool, seconds: float) -> float:
    """Frames per second through feed(): the best of several runs, as the machine may be busy."""
    pieces = chunks(frame) if chunked else [frame] * 4000
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        parser = FrameParser(role=role, version="1.2", validate=validate)
        frames = 0
        started = time.perf_counter()
        for piece in pieces:
            frames += len(parser.feed(piece))
        best = max(best, frames / (time.perf_counter() - started))
    return best


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    cases = [
        ("SEND 1 KiB, 4 headers, validate=True ", SEND, "server", True),
        ("MESSAGE 1 KiB, 8 headers, validate=False", MESSAGE, "client", False),
    ]
    for label, frame, role, validate in cases:
        for chunked in (True, False):
            how = "64 KiB chunks" if chunked else "1 frame/feed "
            fps = rate(frame, role=role, validate=validate, chunked=chunked, seconds=seconds)
            print(f"{label}  {how}  {fps:>10,.0f} frames/s  ({1e6 / fps:.2f} us/frame)")


if __name__ == "__main__":
    main()
