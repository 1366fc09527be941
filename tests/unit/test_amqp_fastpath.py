"""The publish fast path (``fastpath.plain_run`` in ``ProxyConnection.client_data``) against the
framed path it shortcuts: on random streams of publishes and other frames, cut into random
chunks, both must send the broker the same bytes, count the same publishes, offer the screen
the same publishes, and fail at the same place with the same reply."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands

from bridge.frontends.amqp import AmqpProtocolError, Message, ProxyConnection
from bridge.frontends.amqp.builders import publish_frames
from bridge.frontends.amqp.connection import TAIL_MAX, PlainRun
from bridge.frontends.amqp.fastpath import Needles, plain_run
from tests.unit.amqp_wire import (
    HEADER,
    HEARTBEAT,
    body,
    content_header,
    method,
    publish,
    random_chunks,
    raw_frame,
)

C = commands.Connection
HANDSHAKE = (HEADER
             + method(C.StartOk(client_properties={}, mechanism="PLAIN", response="\0g\0g"))
             + method(C.TuneOk(channel_max=2047, frame_max=4096, heartbeat=0))
             + method(C.Open(virtual_host="/")))
DELAYED = commands.Basic.Properties(headers={"x-delay": 5000})


def opened(needles: Needles | None, max_body: int = 1 << 20) -> ProxyConnection:
    conn = ProxyConnection(max_body_size=max_body)
    conn.client_data(HANDSHAKE + method(commands.Channel.Open(), 1)
                     + method(commands.Channel.Open(), 2))
    conn.screen_needles = needles
    return conn


def run(conn: ProxyConnection, chunks: list[bytes]) -> dict[str, Any]:
    """What the relay does with the events: bytes up, publishes counted, messages screened,
    and the error that ended it (code, and the bytes sent before it)."""
    up: list[bytes] = []
    screened: list[bytes] = []
    publishes = 0
    error = None
    for chunk in chunks:
        try:
            events = conn.client_data(chunk)
        except AmqpProtocolError as exc:
            events, error = exc.events, exc.reply_code
        for event in events:
            if isinstance(event, PlainRun):
                publishes += event.publishes
            elif isinstance(event, Message):
                publishes += 1
                screened.append(event.raw)
            up.append(event.raw)
        if error is not None:
            break
    return {"up": b"".join(up), "publishes": publishes, "error": error, "screened": screened}


def message(rng: random.Random, channel: int, screening: bool) -> bytes:
    kind = rng.random()
    size = rng.choice([0, 1, 100, 4088, 4089, 9000])
    if kind < 0.75:
        return publish(channel, bytes([65 + channel]) * size, routing_key=f"q{channel}")
    if kind < 0.8:
        return publish(channel, b"later", DELAYED)  # the screen must see it
    if kind < 0.85:
        return HEARTBEAT
    if kind < 0.9:
        return method(commands.Basic.Ack(delivery_tag=rng.randint(1, 9)), channel)
    if kind < 0.93:
        return method(commands.Tx.Select(), channel)
    if kind < 0.945 and screening:  # one the screen asks to see, its properties unreadable
        # (a publish nobody screens goes to the broker unread: its checks, not the bridge's)
        broken = (b"\x00\x3c\x00\x00" + bytes(8) + b"\x20\x00" + b"\x00\x00\xff\xff"
                  + b"\x07x-delay")
        return (method(commands.Basic.Publish(routing_key="q"), channel)
                + raw_frame(2, channel, broken))
    if kind < 0.96:  # a publish whose body overruns what its header announced
        return (method(commands.Basic.Publish(routing_key="q"), channel)
                + content_header(channel, 3) + body(channel, b"12345"))
    return raw_frame(1, channel, b"\x00\x3c\x00\x28\x00\x00\x01q", end=0x00)  # bad frame end


KEY = (b"\x07x-delay",), ()  # the screen's needles: a header-table key, as on the wire
MENTION = (), (b"q2",)  # a mention, in the routing key of channel 2's publishes


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), needles=st.sampled_from([((), ()), KEY, MENTION]))
def test_fast_and_framed_paths_agree(seed: int, needles: Needles) -> None:
    rng = random.Random(seed)
    stream = b"".join(message(rng, rng.choice([1, 1, 2]), needles == KEY)
                       for _ in range(rng.randint(1, 40)))
    chunks = random_chunks(stream, rng)
    framed = run(opened(None), chunks)
    fast = run(opened(needles), chunks)
    assert fast["up"] == framed["up"]
    assert fast["publishes"] == framed["publishes"]
    assert fast["error"] == framed["error"]
    # Every publish the screen asked to see is still offered to it (those of channel 2, with
    # the mention: its bodies are b"C" * n).
    needle = {KEY: b"x-delay", MENTION: b"q2"}.get(needles)
    if needle is not None:
        wanted = [m for m in framed["screened"] if needle in m]
        assert [m for m in fast["screened"] if needle in m] == wanted


def test_a_chunk_of_whole_publishes_is_one_run() -> None:
    conn = opened(((), ()))
    data = b"".join(publish(1, b"x" * 1024) for _ in range(50))
    [event] = conn.client_data(data)
    assert isinstance(event, PlainRun) and event.publishes == 50 and event.raw == data


def test_only_the_publishes_that_hold_a_needle_are_framed() -> None:
    conn = opened(KEY)
    data = (publish(1, b"plain") + publish(2, b"plain") + publish(1, b"later", DELAYED)
            + publish(2, b"plain"))
    events = conn.client_data(data)
    assert [type(e) for e in events] == [PlainRun, Message, PlainRun]
    assert [getattr(e, "publishes", 1) for e in events] == [2, 1, 1]
    assert b"".join(e.raw for e in events) == data
    assert events[1].properties.headers == {"x-delay": 5000}


def test_a_publish_with_a_screened_property_is_framed() -> None:
    """A property the screen watches (``expiration``: its flag, 0x0100) is found by the
    content header's property flags, not by a table key."""
    short = commands.Basic.Properties(expiration="2500")
    data = publish(1, b"plain") + publish(1, b"short-lived", short) + publish(1, b"plain")
    done, count, _, screened = plain_run(data, 4096, 1 << 20, own=None, flags=0x0100)
    assert (done, count) == (len(data), 3) and [s[0] for s in screened] == [1]
    assert plain_run(data, 4096, 1 << 20, own=None)[3] == []
    conn = opened(((), ()))
    conn.screen_flags = 0x0100
    events = conn.client_data(data)
    assert [type(e) for e in events] == [PlainRun, Message, PlainRun]
    assert events[1].properties.expiration == "2500"


def test_a_message_cut_by_the_chunk_waits_for_its_rest_and_is_counted_as_held() -> None:
    conn = opened(((), ()))
    data = publish(1, b"a" * 10) + publish(1, b"b" * 10)
    cut = len(data) - 5
    [first] = conn.client_data(data[:cut])
    assert isinstance(first, PlainRun) and first.publishes == 1
    assert conn.client_buffered == cut - len(first.raw)
    [second] = conn.client_data(data[cut:])
    assert isinstance(second, PlainRun) and second.raw == publish(1, b"b" * 10)
    assert conn.client_buffered == 0


def test_a_large_message_cut_by_the_chunks_goes_to_the_framer() -> None:
    """Held whole, it would be copied again with every chunk: one of more than TAIL_MAX bytes
    is left to the framer, which keeps its frames as they come."""
    conn = opened(((), ()))
    one = publish_frames(1, commands.Basic.Publish(routing_key="q"), commands.Basic.Properties(),
                         b"z" * (3 * TAIL_MAX), 4096)
    big = one + one
    events = [e for at in range(0, len(big), 65536) for e in conn.client_data(big[at:at + 65536])]
    assert [type(e) for e in events] == [Message, Message]
    assert b"".join(e.raw for e in events) == big


@pytest.mark.parametrize("why", ["own channel", "too large", "not basic"])
def test_the_run_stops_before_what_it_does_not_know(why: str) -> None:
    good = publish(1, b"ok")
    if why == "own channel":
        bad = publish(7, b"x")
        done, n, _, _ = plain_run(good + bad, 4096, 1 << 20, own=7)
    elif why == "too large":
        bad = publish(1, b"x" * 100)
        done, n, _, _ = plain_run(good + bad, 4096, 50, own=None)
    else:
        bad = method(commands.Basic.Publish(routing_key="q"), 1) + content_header(1, 0)
        bad = bad[:len(bad) - 22] + b"\x00\x3d" + bad[len(bad) - 20:]  # class 61 in the header
        done, n, _, _ = plain_run(good + bad, 4096, 1 << 20, own=None)
    assert (done, n) == (len(good), 1)


def test_what_followed_a_refused_publish_on_its_channel_is_dropped_by_recheck() -> None:
    conn = opened(KEY)
    data = (publish(1, b"later", DELAYED) + publish(1, b"a") + publish(2, b"b") + publish(1, b"c")
            + method(commands.Basic.Qos(prefetch_count=1), 1) + publish(1, b"d", DELAYED)
            + method(commands.Basic.Qos(prefetch_count=1), 2))
    first, *rest = conn.client_data(data)
    assert isinstance(first, Message)
    conn.refuse(1, "MQRC_OPTIONS_ERROR (2046): refused")
    kept = conn.recheck(rest)
    assert b"".join(e.raw for e in kept) == (publish(2, b"b")
                                             + method(commands.Basic.Qos(prefetch_count=1), 2))
    assert [getattr(e, "publishes", None) for e in kept] == [1, None]
    again = conn.recheck(kept)  # nothing on channel 1 left to drop
    assert [e.raw for e in again] == [e.raw for e in kept]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), needles=st.sampled_from([((), ()), KEY, MENTION]))
def test_a_chunk_taken_whole_as_plain_is_what_client_data_gives_as_one_run(
    seed: int, needles: Needles
) -> None:
    """``client_plain`` (the link's taking of a read where it arrives) takes a chunk only when
    ``client_data`` would give it as one ``PlainRun`` of all of it, with the same count, and
    changes nothing when it does not take it: a relay asking it first sends the broker the
    same bytes and fails at the same place."""
    rng = random.Random(seed)
    stream = b"".join(message(rng, rng.choice([1, 1, 2]), needles == KEY)
                       for _ in range(rng.randint(1, 40)))
    chunks = random_chunks(stream, rng)
    asked, plain = opened(needles), opened(needles)
    taken = 0
    for chunk in chunks:
        publishes = asked.client_plain(chunk)
        try:
            events = plain.client_data(chunk)
        except AmqpProtocolError:
            assert not publishes
            break
        if publishes:
            taken += 1
            assert len(events) == 1 and isinstance(events[0], PlainRun)
            assert (events[0].raw, events[0].publishes) == (chunk, publishes)
            continue
        assert not (len(events) == 1 and isinstance(events[0], PlainRun)
                    and events[0].raw == chunk), "a whole plain chunk not taken"
        try:
            again = asked.client_data(chunk)  # what was not taken: as if never asked
        except AmqpProtocolError:
            pytest.fail("client_data failed on the connection asked first, not on the other")
        assert [e.raw for e in again] == [e.raw for e in events]
