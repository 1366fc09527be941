"""Runs of plain publishes and plain deliveries, found on the bytes, with no frame objects.

A publisher with confirms sends its publishes back to back: method, content header and body
frames, message after message, with nothing for the bridge to do unless a publish asks for
something the interception layer watches (a delay header, a staging queue's name). Framing,
assembling and screening each of them costs the relay more than all the rest of its work, so
``ProxyConnection.client_data`` first asks :func:`plain_run` how many leading bytes of a chunk
are whole publishes it may pass on untouched, and gives only the rest to the framer.

What the run may hold is narrow on purpose; anything else ends it, and the framer, the
assembler and the screen see that frame as before: frames of exactly the types, channels and
sizes a publish has (a method frame holding Basic.Publish in its plain layout on a channel
other than 0 and the bridge's own, a content header of class Basic on the same channel
announcing at most the largest body allowed, then body frames on that channel adding up to
exactly that size), each within the frame limit and closed by the frame-end octet. A message
cut by the end of the chunk is waited for (``ProxyConnection`` holds its start). A publish of
the run whose method or content header frame holds one of the screen's needles (a delay
header's name, a staging queue's) is framed from its bytes, checked as the framer checks, and
offered to the screen; the others are relayed as they came. Their properties are not walked:
a content header whose properties run out of bounds goes to RabbitMQ as it came, and RabbitMQ
closes the connection over it, as it does without the bridge (the framer would close it with
502 SYNTAX_ERROR).

The broker's side has the same shortcut for a consumer's deliveries (:func:`delivery_run`):
Basic.Deliver in its plain layout, not redelivered, with its content, is what a consumer is
handed message after message, and each needs only its ``JMSXDeliveryCount`` stamped (the same
for all of them: ``Chain.plain_delivery``) and its tag remembered until it is settled.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Final

from pamqp import commands

from adapters.amqp_octets import u16, u32, u64

FRAME_END: Final = 0xCE
_BASIC: Final = commands.Basic.frame_id
# (Basic's class id and these method ids are each under 256.)
_PUBLISH_ID: Final = commands.Basic.Publish.frame_id
_DELIVER_ID: Final = commands.Basic.Deliver.frame_id
_ACK_ID: Final = commands.Basic.Ack.frame_id


# What makes the screen look at a publish, as bytes: header-table keys as they are on the wire
# (their length octet, then the name) and mentions (in an exchange or routing key).
Needles = tuple[tuple[bytes, ...], tuple[bytes, ...]]
# A publish of a run that holds a needle: its place among the run's publishes, where its
# method, content header and body frames are in the chunk ((start, end) of each body frame),
# and where it ends.
Screened = tuple[int, int, int, list[tuple[int, int]], int]


def plain_run(data: bytes, limit: int, max_body: int, own: int | None,
              needles: Needles = ((), ()), first_screened: bool = False, flags: int = 0,
              ) -> tuple[int, int, bool, list[Screened]]:
    """(bytes, publishes, short, screened): how many leading bytes of ``data`` are whole
    publishes of the plain kind, how many publishes they are, whether what follows them is
    such a publish so far, cut short by the end of ``data``, and which of them hold one of
    ``needles`` (to be framed from their bytes and offered to the screen; the others are
    relayed as they came): one of its header-table keys in its content header frame, when that
    has a header table, one of its mentions in its method frame (where the screen looks for
    them), or a property among ``flags`` (a mask of the content header's property flags).
    ``limit`` is the largest frame (its 8 bytes of overhead included), ``max_body`` the largest
    body, ``own`` the bridge's own channel. With ``first_screened`` it stops at the
    first publish that holds a needle (the run found so far, and that one as ``screened``):
    enough to tell that ``data`` is not all publishes to relay as they came. (Frame headers
    are read octet by octet: as C, that costs a tenth of what ``struct`` did, which made a
    tuple of objects each time.)"""
    keys, mentions = needles
    size_of = len(data)
    done = count = 0
    screened: list[Screened] = []
    pos = 0
    no_own = -1 if own is None else own
    while True:
        start = pos
        if pos + 7 > size_of:
            break
        channel = u16(data, pos + 1)
        size = u32(data, pos + 3)
        end = pos + size + 8
        if data[pos] != 1 or channel == 0 or channel == no_own or size < 9 or size + 8 > limit:
            return done, count, False, screened
        if end > size_of:
            break
        if (data[end - 1] != FRAME_END or data[pos + 7] != 0 or data[pos + 8] != _BASIC
                or data[pos + 9] != 0 or data[pos + 10] != _PUBLISH_ID):  # (size >= 9)
            return done, count, False, screened
        exchange = data[pos + 13]
        if pos + 14 + exchange >= end or size != 9 + exchange + data[pos + 14 + exchange]:
            return done, count, False, screened  # not the plain layout
        header_at = pos = end
        if pos + 7 > size_of:
            break
        size = u32(data, pos + 3)
        end = pos + size + 8
        if (data[pos] != 2 or u16(data, pos + 1) != channel or size < 14
                or size + 8 > limit):
            return done, count, False, screened
        if end > size_of:
            break
        body_size = u64(data, pos + 11)  # (size >= 14)
        if (data[end - 1] != FRAME_END or data[pos + 7] != 0 or data[pos + 8] != _BASIC
                or body_size > max_body):
            return done, count, False, screened
        header_end = pos = end
        got = 0
        while got < body_size:
            if pos + 7 > size_of:
                break
            size = u32(data, pos + 3)
            end = pos + size + 8
            if (data[pos] != 3 or u16(data, pos + 1) != channel
                    or size + 8 > limit or got + size > body_size):
                return done, count, False, screened
            if end > size_of:
                break
            if data[end - 1] != FRAME_END:
                return done, count, False, screened
            got += size
            pos = end
        if got != body_size:
            break  # the message goes on in the next chunk
        if ((keys and data[header_at + 19] & 0x20 and _holds(data, keys, header_at + 21,
                                                             header_end))
                or (mentions and _holds(data, mentions, start, header_at))
                or (flags and ((data[header_at + 19] << 8) | data[header_at + 20]) & flags)):
            screened.append((count, start, header_at, _frames(data, header_end, pos), pos))
            if first_screened:
                return done, count, False, screened
        done = pos
        count += 1
    return done, count, start < size_of, screened


def _holds(data: bytes, needles: tuple[bytes, ...], start: int, end: int) -> bool:
    for needle in needles:
        if data.find(needle, start, end) >= 0:
            return True
    return False


def _frames(data: bytes, pos: int, end: int) -> list[tuple[int, int]]:
    """(start, end) of each frame from ``pos`` to ``end`` (a checked run's body frames)."""
    out = []
    while pos < end:
        after = pos + u32(data, pos + 3) + 8
        out.append((pos, after))
        pos = after
    return out


def without_channels(raw: bytes, channels: Container[int]) -> tuple[bytes, int]:
    """A run's bytes without its frames on ``channels`` (closed by the bridge after the run was
    found), and how many publishes are left in it."""
    parts: list[bytes] = []
    pos = count = 0
    while pos < len(raw):
        end = pos + u32(raw, pos + 3) + 8
        if u16(raw, pos + 1) not in channels:
            parts.append(raw[pos:end])
            count += raw[pos] == 1
        pos = end
    return b"".join(parts), count


# One delivery of a run: where its frames start in the chunk (method, content header, body),
# where it ends, and what the method says (channel, consumer tag, delivery tag).
Found = tuple[int, int, int, int, int, bytes, int]


def delivery_run(data: bytes, own: int | None,
                 keys: tuple[bytes, ...] = ()) -> tuple[int, list[Found], int, bool]:
    """(bytes, deliveries, confirms, short): how many leading bytes of ``data`` are whole
    deliveries of the plain kind (Basic.Deliver with its arguments only, the redelivered bit
    clear, on a channel other than 0 and ``own``, its content header of class Basic, with no
    header-table entry named in ``keys`` (each as on the wire: its length octet, then its
    name), and its body frames adding up to the size announced) and publisher confirms
    (Basic.Ack frames, which nobody on the bridge reads), each delivery's offsets and fields,
    how many confirms, and whether what follows them is such a delivery or confirm so far, cut
    short by the end of ``data``. The broker is trusted to keep within the frame size it
    agreed; its frames are checked here only for what is read."""
    size_of = len(data)
    found: list[Found] = []
    pos = done = confirms = 0
    no_own = -1 if own is None else own
    while True:
        start = pos
        if pos + 7 > size_of:
            break
        channel = u16(data, pos + 1)
        size = u32(data, pos + 3)
        end = pos + size + 8
        if data[pos] != 1 or channel == 0 or channel == no_own or size < 13:
            return done, found, confirms, False
        if end > size_of:
            break
        if data[end - 1] != FRAME_END or data[pos + 7] != 0 or data[pos + 8] != _BASIC:
            return done, found, confirms, False
        method = u16(data, pos + 9)
        if method == _ACK_ID and size == 13:  # a publisher confirm: delivery tag, multiple bit
            confirms += 1
            done = pos = end
            continue
        if method != _DELIVER_ID or size < 16:
            return done, found, confirms, False
        at = pos + 12 + data[pos + 11]  # past the consumer tag
        if at + 11 > end:
            return done, found, confirms, False
        exchange_at = at + 9
        key_at = exchange_at + 1 + data[exchange_at]
        if (data[at + 8] & 1 or key_at >= end - 1
                or key_at + 1 + data[key_at] != end - 1):
            return done, found, confirms, False  # redelivered, or not the plain layout
        consumer = data[pos + 12:at]
        tag = u64(data, at)
        header_at = pos = end
        if pos + 7 > size_of:
            break
        size = u32(data, pos + 3)
        end = pos + size + 8
        if data[pos] != 2 or u16(data, pos + 1) != channel or size < 14:
            return done, found, confirms, False
        if end > size_of:
            break
        if data[end - 1] != FRAME_END or data[pos + 7] != 0 or data[pos + 8] != _BASIC:
            return done, found, confirms, False
        body_size = u64(data, pos + 11)  # (size >= 14)
        if keys and data[pos + 19] & 0x20:  # a header table: none of its keys may be one
            if _holds(data, keys, pos + 21, end):
                return done, found, confirms, False
        body_at = pos = end
        got = 0
        while got < body_size:
            if pos + 7 > size_of:
                break
            size = u32(data, pos + 3)
            end = pos + size + 8
            if (data[pos] != 3 or u16(data, pos + 1) != channel
                    or got + size > body_size):
                return done, found, confirms, False
            if end > size_of:
                break
            if data[end - 1] != FRAME_END:
                return done, found, confirms, False
            got += size
            pos = end
        if got != body_size:
            break
        done = pos
        found.append((start, header_at, body_at, pos, channel, consumer, tag))
    return done, found, confirms, start < size_of
