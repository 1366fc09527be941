"""Bytes -> STOMP frames with limits, h11-style: receive_data(), next_event(), no I/O.

The relay parses every frame in both directions, so the parser works on the received ``bytes``
object in place (an offset, no per-frame copy of the buffer, no per-byte loop). Chunks that
arrive while a frame is incomplete are kept aside and only joined once they can complete it
(the header terminator, the NUL or the content-length is there), which keeps a large frame
arriving in small pieces linear instead of quadratic. Header sections are decoded by
``bridge.frontends.stomp.header_decoding``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from bridge.frontends.stomp.errors import StompProtocolError
from bridge.frontends.stomp.escaping import UNESCAPED_COMMANDS, VERSIONS, unescape_table
from bridge.frontends.stomp.frame import (
    CLIENT_COMMANDS,
    HEARTBEAT,
    NEED_DATA,
    SERVER_COMMANDS,
    Frame,
    Headers,
    HeartBeat,
    LazyHeaders,
    NeedData,
)
from bridge.frontends.stomp.header_decoding import (
    ESCAPES,
    content_length,
    decode_escaped,
    decode_headers,
    decode_plain,
    error,
    head_pattern,
    raw_content_length,
)

Event = Frame | HeartBeat

# A frame whose command and headers are read but whose body is still arriving:
# (command, headers or None when lazy, lazy decoder, body offset from the frame start, length)
_Partial = tuple[str, Headers | None, LazyHeaders | None, int, int | None]

# What an incomplete parse waits for before the buffered chunks are worth joining.
_READY, _ANY, _HEAD, _NUL, _LEN = range(5)

_new_frame = Frame.__new__
# An unknown command passed on must read the same to the broker: letters, digits, '-', '_'
# only (a NUL or a control byte in it could make the broker see another frame).
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-connection limits; ``max_buffer_bytes`` defaults to one frame plus one socket read."""

    max_frame_bytes: int = 64 * 1024 * 1024
    max_headers: int = 1000
    max_header_bytes: int = 64 * 1024
    max_buffer_bytes: int = 0

    def __post_init__(self) -> None:
        if self.max_buffer_bytes <= 0:
            object.__setattr__(self, "max_buffer_bytes", self.max_frame_bytes + 256 * 1024)


class FrameParser:
    """Parse STOMP frames from a byte stream; one per connection direction.

    ``role="server"`` reads what clients send, ``role="client"`` what a broker sends. With
    ``validate=False`` (the trusted broker side) frame boundaries, command and content-length
    are still exact, but headers are decoded on first use and unknown commands pass.
    ``relay_unknown=True`` passes unknown commands on a validating parser too (headers still
    checked): the session lets the broker answer them. A NUL between frames is skipped, as
    RabbitMQ and ActiveMQ skip it.
    """

    __slots__ = (
        "role", "_version", "_limits", "_max_frame", "_max_head", "_max_headers", "_validate",
        "_commands", "_command_set", "_head", "_head_escaped", "_table", "_crlf",
        "_data", "_pos", "_more", "_more_len", "_checked", "_tail", "_wait", "_need",
        "_partial", "_error", "_relay_unknown",
    )  # fmt: skip

    def __init__(
        self,
        *,
        role: str = "server",
        version: str | None = None,
        limits: Limits = Limits(),  # noqa: B008 - frozen, shared safely
        validate: bool = True,
        relay_unknown: bool = False,
    ) -> None:
        if role == "server":
            commands = CLIENT_COMMANDS
        elif role == "client":
            commands = SERVER_COMMANDS
        else:
            raise ValueError(f"role must be 'server' or 'client', not {role!r}")
        self.role = role
        self._commands = {name.encode(): name for name in commands}
        self._command_set = frozenset(commands)
        self._limits = limits
        self._max_frame = limits.max_frame_bytes
        self._max_head = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._validate = validate
        self._relay_unknown = relay_unknown
        self._data = b""  # the bytes being parsed; frames are sliced out of it from _pos
        self._pos = 0
        self._more: list[bytes] = []  # chunks received since, not yet joined onto _data
        self._more_len = 0
        self._checked = 0  # how many of _more were already searched for what _wait needs
        self._tail = b""  # last bytes searched, for a header terminator split across chunks
        self._wait = _ANY
        self._need = 0
        self._partial: _Partial | None = None
        self._error: StompProtocolError | None = None
        self.version = version

    @property
    def version(self) -> str | None:
        """The negotiated version, None before CONNECTED; settable at any time."""
        return self._version

    @version.setter
    def version(self, version: str | None) -> None:
        if version not in VERSIONS:
            raise ValueError(f"unsupported STOMP version {version!r}")
        self._version = version
        self._table = unescape_table(version)
        # Plain heads (the common case) match the cheaper pattern; the escape-aware one is
        # tried only on a head that failed it and holds a backslash.
        self._head = head_pattern(self._command_set, None)
        escape = ESCAPES[version]
        self._head_escaped = None if escape is None else head_pattern(self._command_set, escape)
        self._crlf = version in (None, "1.2")
        if self._partial is not None:  # re-read a half-received frame under the new rules
            self._partial = None
            self._wait = _ANY

    @property
    def buffered(self) -> int:
        """Bytes kept for a frame not yet complete (the whole buffer they sit in), 0 when none."""
        if self._pos >= len(self._data) and not self._more_len:
            return 0
        return len(self._data) + self._more_len

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer; nothing is parsed until next_event()."""
        if self._error is not None:
            raise self._error
        if not data:
            return
        if type(data) is not bytes:
            data = bytes(data)
        self._more.append(data)
        self._more_len += len(data)
        buffered = len(self._data) - self._pos + self._more_len
        if buffered > self._limits.max_buffer_bytes:
            self._error = error(
                self._version,
                "buffer-overflow",
                "too much unread data",
                f"{buffered} bytes buffered; at most {self._limits.max_buffer_bytes}",
            )
            raise self._error

    def next_event(self) -> Frame | HeartBeat | NeedData:
        """The next frame or heart-beat, or NEED_DATA; raises StompProtocolError (then always)."""
        if self._error is not None:
            self._error.events = []
            raise self._error
        try:
            while True:
                wait = self._wait
                if wait:
                    if not self._more or (wait != _ANY and not self._ready(wait)):
                        return NEED_DATA
                    self._join()
                event = self._parse()
                if event is not NEED_DATA:
                    return event
        except StompProtocolError as exc:
            self._error = exc
            exc.events = []
            raise

    def feed(self, data: bytes) -> list[Event]:
        """receive_data(data), then every complete event: the relay's hot path.

        On a protocol error the events parsed from this call before the bad frame are in the
        error's ``events`` (so the relay can still forward them) and the error is raised.
        """
        if self._error is not None:
            self._error.events = []
            raise self._error
        if (
            self._wait == _ANY
            and not self._more
            and self._pos >= len(self._data)
            and type(data) is bytes
            and data
        ):
            self._data = data  # nothing left over: parse the caller's bytes in place
            self._pos = 0
            self._wait = _READY
        else:
            self.receive_data(data)
        events: list[Event] = []
        append = events.append
        parse = self._parse
        try:
            while True:
                wait = self._wait
                if wait:
                    if not self._more or (wait != _ANY and not self._ready(wait)):
                        return events
                    self._join()
                if self._partial is None:
                    if self._validate:
                        self._scan(append)
                    else:
                        self._scan_trusted(append)
                    if self._pos >= len(self._data):  # all of it scanned: what _parse would do
                        self._data = b""
                        self._pos = 0
                        self._wait = _ANY
                        return events
                event = parse()
                if event is not NEED_DATA:
                    append(event)  # type: ignore[arg-type]
        except StompProtocolError as exc:
            self._error = exc
            exc.events = events
            raise

    # -- internals ---------------------------------------------------------------------------

    def _scan(self, append: Callable[[Event], None]) -> None:
        """The common case, fast: complete frames with LF line ends and plain headers.

        One compiled pattern matches the command, checks every header line and finds the
        body. Appends every such event from ``_pos`` on and stops, without consuming it, at
        the first thing it does not handle (an incomplete or unusual frame, CRLF, an escape,
        non-ASCII, a bad value): ``_parse`` then deals with that one exactly, errors included.
        """
        data = self._data
        pos = self._pos
        n = len(data)
        find = data.find
        head = self._head.match
        commands = self._commands
        max_head = self._max_head
        max_frame = self._max_frame
        max_headers = self._max_headers
        new = _new_frame
        while pos < n:
            if data[pos] == 10:
                append(HEARTBEAT)
                pos += 1
                continue
            if data[pos] == 0:  # a stray NUL between frames: filler, as the brokers read it
                pos += 1
                continue
            m = head(data, pos)
            escaped = False
            if m is None:
                m = self._escaped_head(data, pos)
                if m is None:
                    break
                escaped = True
            command_bytes, block = m.groups()
            body_start = m.end()
            if body_start - pos > max_head or block.count(b"\n") > max_headers:
                break
            # From the LF that ends the command line, so only a line start can match.
            cl = find(b"\ncontent-length:", m.start(2) - 1, body_start)
            if cl >= 0:
                value = data[cl + 16 : find(b"\n", cl + 16)]
                if not value.isdigit():
                    break
                end = body_start + int(value)
                if end >= n or data[end] != 0:
                    break
            else:
                end = find(b"\0", body_start, pos + max_frame)
                if end < 0:
                    break
            if end - pos >= max_frame:
                break
            frame = new(Frame)
            frame.command = commands[command_bytes]
            frame.raw = data[pos : end + 1]
            frame.body_at = body_start - pos
            frame._headers = None
            if escaped:
                frame._lazy = self._escaped_decoder(frame.command, block)
            else:
                frame._lazy = (decode_plain, (block,))
            append(frame)
            pos = end + 1
        self._pos = pos

    def _escaped_head(self, data: bytes, pos: int) -> re.Match[bytes] | None:
        """The head at ``pos`` if it is plain but for escapes the version defines."""
        if self._head_escaped is None or data.find(b"\\", pos, pos + self._max_head) < 0:
            return None
        return self._head_escaped.match(data, pos)

    def _escaped_decoder(self, command: str, block: bytes) -> LazyHeaders:
        """How to decode a head with backslashes that ``_scan`` accepted."""
        if self._table is None or command in UNESCAPED_COMMANDS:
            return (decode_plain, (block,))  # backslashes stand for themselves
        return (decode_escaped, (block, self._table))

    def _scan_trusted(self, append: Callable[[Event], None]) -> None:
        """``_scan`` for a trusted peer (validate=False): frame boundaries only, headers lazy."""
        data = self._data
        pos = self._pos
        n = len(data)
        find = data.find
        commands = self._commands
        max_head = self._max_head
        max_frame = self._max_frame
        escaped = (self._table, self._crlf, self._version, self._max_headers)
        unescaped = (None, self._crlf, self._version, self._max_headers)
        new = _new_frame
        while pos < n:
            if data[pos] == 10:
                append(HEARTBEAT)
                pos += 1
                continue
            if data[pos] == 0:  # a stray NUL between frames: filler, as the brokers read it
                pos += 1
                continue
            lf = find(b"\n", pos, pos + 16)
            if lf < 0 or data[lf - 1] == 13:
                break
            command = commands.get(data[pos:lf])
            if command is None:
                break
            head_end = find(b"\n\n", lf, pos + max_head)
            if head_end < 0 or find(b"\r", lf, head_end) >= 0 or find(b"\0", lf, head_end) >= 0:
                break
            body_start = head_end + 2
            cl = find(b"\ncontent-length:", lf, head_end)
            if cl >= 0:
                value = data[cl + 16 : find(b"\n", cl + 16, head_end + 1)]
                if not value.isdigit():
                    break
                end = body_start + int(value)
                if end >= n or data[end] != 0:
                    break
            else:
                end = find(b"\0", body_start, pos + max_frame)
                if end < 0:
                    break
            if end - pos >= max_frame:
                break
            frame = new(Frame)
            frame.command = command
            frame.raw = data[pos : end + 1]
            frame.body_at = body_start - pos
            frame._headers = None
            args = unescaped if command in UNESCAPED_COMMANDS else escaped
            frame._lazy = (decode_headers, (data[lf + 1 : head_end], *args))
            append(frame)
            pos = end + 1
        self._pos = pos

    def _join(self) -> None:
        more = self._more
        if self._pos >= len(self._data) and len(more) == 1:
            self._data = more[0]
        else:
            more.insert(0, self._data[self._pos :])
            self._data = b"".join(more)
        self._pos = 0
        more.clear()
        self._more_len = 0
        self._wait = _READY

    def _ready(self, wait: int) -> bool:
        """Whether the chunks in _more can complete the pending frame; enforces the limits."""
        avail = len(self._data) - self._pos + self._more_len
        if wait == _LEN:
            return avail >= self._need
        more = self._more
        i = self._checked
        if wait == _NUL:
            while i < len(more):
                if b"\0" in more[i]:
                    return True
                i += 1
            self._checked = i
            if avail >= self._max_frame:
                raise self._too_large(avail)
            return False
        tail = self._tail
        while i < len(more):
            window = tail + more[i]
            if b"\n\n" in window or b"\n\r\n" in window:
                return True
            tail = window[-2:]
            i += 1
        self._tail = tail
        self._checked = i
        if avail >= self._max_head:
            raise self._header_too_large(avail)
        return False

    def _wait_for(self, wait: int, data: bytes, pos: int) -> NeedData:
        self._wait = wait
        self._checked = 0
        if wait == _HEAD:
            self._tail = data[max(pos, len(data) - 2) :]
        return NEED_DATA

    def _too_large(self, size: int) -> StompProtocolError:
        return error(
            self._version,
            "frame-too-large",
            "frame too large",
            f"frame of at least {size} bytes; at most {self._max_frame} are accepted",
        )

    def _header_too_large(self, size: int) -> StompProtocolError:
        return error(
            self._version,
            "header-too-large",
            "header section too large",
            f"command and headers of at least {size} bytes; "
            f"at most {self._limits.max_header_bytes} are accepted",
        )

    def _parse(self) -> Frame | HeartBeat | NeedData:
        """The event at _pos of _data, or NEED_DATA with _wait saying what is missing.

        One straight function on purpose: this runs for every frame in both directions.
        """
        data = self._data
        pos = self._pos
        n = len(data)
        if pos >= n:
            if n:
                self._data = b""
                self._pos = 0
            self._wait = _ANY
            return NEED_DATA
        first = data[pos]
        if first == 10:
            self._pos = pos + 1
            return HEARTBEAT
        if first == 0 and self._partial is None:
            while pos < n and data[pos] == 0:
                pos += 1
            self._pos = pos
            return self._parse()
        if first == 13:
            if pos + 1 >= n:
                self._wait = _ANY
                return NEED_DATA
            if data[pos + 1] == 10:
                self._pos = pos + 2
                return HEARTBEAT
        partial = self._partial
        if partial is None:
            bound = pos + self._max_head
            lf = data.find(b"\n", pos, bound)
            # The blank line is the first "\n\n" or "\n\r\n". Search first for the form the
            # command line suggests, so that the other search is bounded by its result.
            cr_blank = False
            if lf < 0:
                head_end = -1
            elif data[lf - 1] != 13:
                cmd_end = lf
                head_end = data.find(b"\n\n", lf, bound)
                if head_end >= 0:
                    block = data[lf + 1 : head_end]
                    if b"\r" in block:  # without a CR no "\n\r\n" can come earlier
                        crlf_end = data.find(b"\n\r\n", lf, head_end + 2)
                        if crlf_end >= 0:
                            head_end = crlf_end
                            cr_blank = True
                            block = data[lf + 1 : head_end]
                else:
                    head_end = data.find(b"\n\r\n", lf, bound)
                    if head_end >= 0:
                        cr_blank = True
                        block = data[lf + 1 : head_end]
            else:
                cmd_end = lf - 1
                head_end = data.find(b"\n\r\n", lf, bound)
                lf_end = data.find(b"\n\n", lf, head_end + 1 if head_end >= 0 else bound)
                if lf_end >= 0:
                    head_end = lf_end
                elif head_end >= 0:
                    cr_blank = True
                if head_end >= 0:
                    block = data[lf + 1 : head_end]
            if head_end < 0:
                if n >= bound:
                    raise self._header_too_large(n - pos)
                return self._wait_for(_HEAD, data, pos)
            body_start = head_end + 3 if cr_blank else head_end + 2
            raw_command = data[pos:cmd_end]
            command = self._commands.get(raw_command)
            if command is None:
                command = self._odd_command(raw_command)
            table = None if command in UNESCAPED_COMMANDS else self._table
            length = None
            if self._validate:
                lazy = None
                if cr_blank and not self._crlf:
                    raise error(
                        self._version,
                        "bad-header",
                        "malformed header line",
                        f"a header line holds only CR; STOMP {self._version} ends lines with LF",
                    )
                if block:
                    if b"\0" in block:
                        raise error(
                            self._version, "bad-header", "NUL in headers", "a header holds NUL"
                        )
                    headers: Headers | None = decode_headers(
                        block, table, self._crlf, self._version, self._max_headers
                    )
                    for name, value in headers:  # type: ignore[union-attr]
                        if name == "content-length":
                            if value.isdigit() and value.isascii():
                                length = int(value)
                            else:
                                length = content_length(value, self._version)
                            break
                else:
                    headers = []
            else:
                headers = None
                lazy = (
                    decode_headers,
                    (block, table, self._crlf, self._version, self._max_headers),
                )
                if block:
                    raw_length = raw_content_length(block, self._crlf)
                    if raw_length is not None:
                        if raw_length.isdigit():
                            length = int(raw_length)
                        else:
                            length = content_length(raw_length, self._version)
            offset = body_start - pos
            if length is not None and offset + length + 1 > self._max_frame:
                raise self._too_large(offset + length + 1)
        else:
            command, headers, lazy, offset, length = partial
            body_start = pos + offset
        if length is not None:
            end = body_start + length
            if end >= n:
                self._partial = (command, headers, lazy, body_start - pos, length)
                self._need = end + 1 - pos
                return self._wait_for(_LEN, data, pos)
            if data[end] != 0:
                raise error(
                    self._version,
                    "missing-nul",
                    "frame not terminated by NUL",
                    f"{command} frame: no NUL after the {length} body bytes of its content-length",
                )
        else:
            end = data.find(b"\0", body_start, pos + self._max_frame)
            if end < 0:
                if n - pos >= self._max_frame:
                    raise self._too_large(n - pos)
                self._partial = (command, headers, lazy, body_start - pos, length)
                return self._wait_for(_NUL, data, pos)
        self._pos = end + 1
        if partial is not None:
            self._partial = None
        frame = _new_frame(Frame)
        frame.command = command
        frame.raw = data[pos : end + 1]
        frame.body_at = body_start - pos
        frame._headers = headers
        frame._lazy = lazy
        return frame

    def _odd_command(self, raw_command: bytes) -> str:
        """A command outside the role's table: an error when validating, else just decoded."""
        try:
            command = raw_command.decode()
        except UnicodeDecodeError:
            raise error(
                self._version, "bad-encoding", "command is not UTF-8", f"command {raw_command!r}"
            ) from None
        if self._validate and not (self._relay_unknown and _TOKEN.fullmatch(command)):
            raise error(
                self._version,
                "unknown-command",
                "unknown command",
                f"{command[:100]!r} is not a STOMP command a "
                f"{'client' if self.role == 'server' else 'broker'} may send",
            )
        return command
