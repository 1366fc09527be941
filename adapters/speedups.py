"""Speed-ups that replace internals of pika and stomp.py: installed only by code that asks.

Importing the adapters changes nothing in either library. The staging engine's process calls
``install()`` once at its start (``bridge.app.engine_process``); every other client of pika or
stomp.py in a process that did not ask runs the libraries as published. Each speed-up checks the
library's version and the internals it replaces, and stands down with a warning on one it was
not checked against.

What each replaces, and what it buys (figures: docs/benchmarks.md, "Measurements behind design
choices"):

- ``pika``: ``_AsyncTransportBase._produce`` (pika.adapters.utils.io_services_utils). pika
  queues every frame it marshals as its own buffer (a publish is three: method, header, body)
  and sends them one ``send`` call each. A settle batch of 500 moves is about 1,600 system
  calls, and on loopback each costs the kernel's whole TCP path: a large share of the staging
  engine's time. The replacement joins the queued buffers, up to ``JOIN_LIMIT``
  bytes at a time, before pika's own loop sends them; what goes on the wire is unchanged.
  Checked against pika 1.3 and 1.4 (1.4.4).
- ``stomp.py``: ``stomp.transport.parse_frame``. stomp.py parses each frame it receives with two
  ``re.sub`` calls per header, for escapes that are almost never there: several times the
  replacement's cost on a staged message's MESSAGE frame of 20 headers, paid for each of a
  level subscription's 1,000 prefetched messages in the engine's CPU and GIL. The replacement
  gives the same result, taking the regular expressions only for a header that has a backslash
  in it.
  Checked against stomp.py 8.1 and 8.2 (8.2.0).
"""

from __future__ import annotations

import collections
import re
import warnings
from collections.abc import Callable
from importlib import metadata
from typing import Any

import stomp.transport  # type: ignore[import-untyped]
import stomp.utils  # type: ignore[import-untyped]
from pika.adapters.utils import io_services_utils
from stomp.utils import Frame

__all__ = ["JOIN_LIMIT", "install", "installed", "parse_frame", "uninstall"]

# The (major, minor) releases each speed-up was checked against.
CHECKED = {"pika": ((1, 3), (1, 4)), "stomp.py": ((8, 1), (8, 2))}

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


# -- stomp.py --------------------------------------------------------------------------------

_ESCAPE = re.compile(r"\\.")
_unescape = stomp.utils._unescape_header  # stomp.py's own rules, unknown escapes kept


def parse_frame(frame: bytes) -> Frame | None:
    """What ``stomp.utils.parse_frame`` returns for ``frame``: the command, each header's first
    value (unescaped), and the body after the first blank line (LF LF or CRLF CRLF)."""
    lf, crlf = frame.find(b"\n\n"), frame.find(b"\r\n\r\n")
    if lf >= 0 and (crlf < 0 or lf < crlf):
        preamble, body = frame[:lf], frame[lf + 2:]
    elif crlf >= 0:
        preamble, body = frame[:crlf], frame[crlf + 4:]
    else:
        preamble, body = frame, b""
    # Lines end with LF or CRLF (a CR with no LF after it, at the end, is kept).
    lines = preamble.decode("utf-8", errors="replace").split("\n")
    for i in range(len(lines) - 1):
        if lines[i].endswith("\r"):
            lines[i] = lines[i][:-1]
    first = 0
    while first < len(lines) and not lines[first]:
        first += 1
    if first >= len(lines):
        return None
    headers: dict[str, str] = {}
    for line in lines[first + 1:]:
        key, colon, value = line.partition(":")
        if not colon or not key:
            continue
        if "\\" in key:
            key = _ESCAPE.sub(_unescape, key)
        if key not in headers:
            headers[key] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
    return Frame(lines[first], headers, body)


# -- installing ---------------------------------------------------------------------------------
_ORIGINALS: dict[str, tuple[Any, str, Any]] = {}


def _known(distribution: str) -> bool:
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    parts = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
    return parts in CHECKED[distribution]


def _patches() -> dict[str, tuple[str, Any, str, Callable[..., Any]]]:
    """name -> (distribution, owner, attribute, replacement)."""
    return {
        "pika-writes": ("pika", _Transport, "_produce", _produce),
        "stomp-parse": ("stomp.py", stomp.transport, "parse_frame", parse_frame),
    }


def install() -> list[str]:
    """Install every speed-up whose library version and internals are the ones it was checked
    against; warn about and skip the others. Returns the names installed. Idempotent."""
    done = []
    for name, (dist, owner, attr, replacement) in _patches().items():
        if name in _ORIGINALS:
            done.append(name)
            continue
        extra = ("_sigint_safe_send",) if name == "pika-writes" else ()
        if not _known(dist) or owner is None or not all(
            hasattr(owner, a) for a in (attr, *extra)
        ):
            warnings.warn(
                f"jms-bridge speed-up {name} not installed: {dist} "
                f"{_version(dist)} is not a version it was checked against", stacklevel=2,
            )
            continue
        _ORIGINALS[name] = (owner, attr, getattr(owner, attr))
        setattr(owner, attr, replacement)
        done.append(name)
    return done


def installed() -> list[str]:
    return sorted(_ORIGINALS)


def uninstall() -> None:
    """Put the libraries' own functions back (tests)."""
    for owner, attr, original in _ORIGINALS.values():
        setattr(owner, attr, original)
    _ORIGINALS.clear()


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "(not installed)"
