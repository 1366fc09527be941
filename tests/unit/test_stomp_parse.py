"""adapters.speedups.parse_frame gives what stomp.py's own parse_frame gives."""

from __future__ import annotations

import stomp.transport
import stomp.utils
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import speedups

PIECES = st.sampled_from(
    [b"\n", b"\r\n", b"\r", b":", b"\\", b"\\c", b"\\n", b"\\r", b"\\\\", b"\\t", b"MESSAGE",
     b"key", b"value", b"\n\n", b"\r\n\r\n", b"\x00", b"\xff", "é".encode(), b" "]
)
FRAMES = st.lists(st.one_of(PIECES, st.binary(max_size=6)), max_size=40).map(b"".join)


def same(frame: bytes) -> None:
    want = stomp.utils.parse_frame(frame)
    got = speedups.parse_frame(frame)
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.cmd, got.headers, got.body) == (want.cmd, want.headers, want.body)


@settings(max_examples=3000)
@given(FRAMES)
def test_any_bytes_parse_as_stomp_py_parses_them(frame: bytes) -> None:
    same(frame)


def test_typical_frames() -> None:
    for frame in [
        b"MESSAGE\nsubscription:1\ndestination:/queue/a\ncontent-length:3\n\na\n\x00",
        b"\n\nRECEIPT\r\nreceipt-id:r-1\r\n\r\n",
        b"MESSAGE\nk\\cey:v\\na\\\\l\nk\\cey:second\nweird\\q:x\n\nbody",
        b"ERROR\nmessage:bad: very\n:novalue\nnocolon\n\nwhat\n\nmore",
        b"\n\n\n",
        b"CONNECTED\nversion:1.2",
    ]:
        same(frame)
