"""The fuzz targets (tests/fuzz): every seed passes them, a short coverage-guided run of each
finds nothing, and the bugs fuzzing found stay fixed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.frontends.stomp import serialize
from bridge.frontends.stomp.session import Session, State
from tests.fuzz import targets

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fuzz" / "corpus"


@pytest.mark.parametrize("target", sorted(targets.TARGETS))
def test_every_seed_passes_its_target(target: str) -> None:
    seeds = sorted((CORPUS / target).iterdir())
    assert len(seeds) >= 20, f"the {target} seed corpus is nearly empty"
    for seed in seeds:
        targets.TARGETS[target](seed.read_bytes())


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None,
                    reason="atheris is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize("target", sorted(targets.TARGETS))
def test_a_short_fuzzing_run_finds_nothing(target: str, tmp_path: Path) -> None:
    """2,000 inputs from the seeds, under atheris (in a process of its own: atheris.Fuzz()
    ends the process), with the limits scripts/fuzz uses: 1 s per input, bounded memory."""
    command = [sys.executable, "-m", "tests.fuzz.run", target, "-runs=2000", "-timeout=1",
               "-rss_limit_mb=2048", "-max_len=2048", "-seed=1",
               f"-artifact_prefix={tmp_path}/", str(tmp_path), str(CORPUS / target)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-4000:]
    # (libFuzzer may count one run past -runs: "Done 2001 runs" was seen in CI.)
    ran = re.search(r"Done (\d+) runs", done.stderr)
    assert ran is not None and int(ran.group(1)) >= 2000, done.stderr[-2000:]


# -- regressions: bugs the fuzzers found ---------------------------------------------------------

def test_a_broker_frame_with_undecodable_headers_ends_the_session_cleanly() -> None:
    """Found by the stomp target: headers from the broker are decoded on first use, and a
    MESSAGE whose headers break STOMP (here a bad escape for 1.2) raised StompProtocolError out
    of Session.from_broker, losing the frames before it. Now: those are relayed, then the
    client gets an ERROR and the session closes, as for a framing error."""
    session = Session(chain=targets._chain())
    session.from_client(b"CONNECT\naccept-version:1.2\nlogin:u\npasscode:p\n\n\0")
    session.from_broker(b"CONNECTED\nversion:1.2\n\n\0")
    good = serialize("MESSAGE", [("destination", "/queue/a"), ("subscription", "s1"),
                                 ("message-id", "m1")], b"one")
    bad = b"MESSAGE\ndestination:/queue/a\nsubscription:s1\nmessage-id:m2\nx:\\t\n\ntwo\0"
    out = session.from_broker(good + bad)
    assert out.to_client[0].startswith(b"MESSAGE\n")  # stamped with JMSXDeliveryCount
    assert out.to_client[0].endswith(b"\n\none\0") and len(out.to_client) == 2
    assert out.to_client[-1].startswith(b"ERROR\n") and b"invalid frame" in out.to_client[-1]
    assert out.close is not None and session.state is State.CLOSED
    assert session.stats.protocol_errors["broker-bad-escape"] == 1


def test_a_publish_whose_properties_cannot_be_decoded_is_502_on_arrival() -> None:
    """Found by the amqp target: a client's content header was only checked for its size, so
    properties pamqp cannot read passed the framer and raised AmqpProtocolError later, in the
    publish screen, where the relay expects only a refusal: the task died and the client lost
    its connection without a Connection.Close. Now the framer decodes a client's content
    header on arrival, and client_data raises 502 SYNTAX_ERROR with the frames before it."""
    from bridge.frontends.amqp import AmqpProtocolError, ProxyConnection
    from bridge.frontends.amqp.builders import PROTOCOL_HEADER

    bad = (CORPUS / "amqp" / "regression-publish-bad-properties").read_bytes()
    conn = ProxyConnection()
    with pytest.raises(AmqpProtocolError) as info:
        conn.client_data(PROTOCOL_HEADER + targets.HANDSHAKE + bad[2:])
    assert info.value.reply_code == 502 and "content header" in info.value.reply_text
    assert info.value.reply().startswith(b"\x01\x00\x00")  # a Connection.Close on channel 0
    assert len(info.value.events) == 5  # the header and the handshake still go up


def test_continued_property_flags_are_502_not_a_hang() -> None:
    """Found by the amqp target (a timeout): a content header whose property flags set the
    continuation bit made pamqp read the same flag word for ever, so one publish froze the
    bridge's event loop for every client (the publish screen reads every publish's
    properties). Basic has one flag word: a continued one is now 502 SYNTAX_ERROR."""
    from bridge.frontends.amqp import AmqpProtocolError, ProxyConnection
    from bridge.frontends.amqp.builders import PROTOCOL_HEADER

    hang = (CORPUS / "amqp" / "regression-property-flags-continued").read_bytes()
    with pytest.raises(AmqpProtocolError) as info:
        ProxyConnection().client_data(PROTOCOL_HEADER + targets.HANDSHAKE + hang[2:])
    assert info.value.reply_code == 502 and "property flags" in info.value.reply_text


def test_a_dot_before_a_non_ascii_digit_is_invalid_not_a_hang() -> None:
    """Found by the selector target (a timeout): ``.`` followed by a digit that is not ASCII
    (U+0660, ARABIC-INDIC DIGIT ZERO: ``str.isdigit`` is true) was taken for a number, whose
    patterns matched nothing: an empty token, and the lexer never moved on. Now the digit must
    be ASCII, and a number token is never empty."""
    from policies.errors import InvalidSelector
    from policies.selector.parser import parse

    hang = (CORPUS / "selector" / "regression-dot-then-non-ascii-digit").read_bytes()
    with pytest.raises(InvalidSelector):
        parse(hang.decode("utf-8", "replace"))
    with pytest.raises(InvalidSelector, match="unexpected character"):
        parse("a = .\u06601")


def test_properties_decoded_when_read_are_502_from_the_publish_screen() -> None:
    """Found by the amqp target once content headers were walked on arrival and decoded only
    when read: a publish whose content type is not UTF-8 (in bounds, so the walk passes it)
    is a 502 when the publish screen reads it (it names a delay header), which the relay
    sends as Connection.Close; it is never another exception."""
    from bridge.frontends.amqp import AmqpProtocolError, Message, ProxyConnection
    from bridge.frontends.amqp.builders import PROTOCOL_HEADER

    bad = (CORPUS / "amqp" / "regression-lazy-properties-bad-utf8").read_bytes()
    conn = ProxyConnection()
    events = conn.client_data(PROTOCOL_HEADER + targets.HANDSHAKE + bad[2:])
    (message,) = [e for e in events if type(e) is Message]
    with pytest.raises(AmqpProtocolError) as info:
        targets._run(targets._SCREEN(message, conn))
    assert info.value.reply_code == 502 and "content header" in info.value.reply_text
    assert info.value.reply().startswith(b"\x01\x00\x00")


def test_an_amqplain_response_whose_array_overruns_is_unreadable_not_a_hang() -> None:
    """Found by the amqp target (a timeout): a Connection.Start-Ok whose AMQPLAIN response
    holds a field array announcing more bytes than it has made pamqp's decoder loop for ever
    (an empty rest decodes as a zero-byte value). The response is bounds-checked first now: no
    principal, and the broker judges the login."""
    from types import SimpleNamespace

    from bridge.frontends.amqp.connection import credentials

    response = b"\x05LOGINA\x07\x00\x00\x00\x00"
    start_ok = SimpleNamespace(mechanism="AMQPLAIN", response=response.decode("latin-1"))
    assert credentials(start_ok) == (None, None)
    data = (CORPUS / "amqp" / "regression-amqplain-array-overruns").read_bytes()
    targets.amqp(data)  # returns (a hang here was the bug)


def test_a_delayed_publish_with_delivery_mode_3_is_staged_not_a_crash() -> None:
    """Found by the amqp target: a delayed publish whose delivery mode is neither 1 nor 2
    (RabbitMQ takes any octet and persists only 2) made pamqp refuse to write the staged
    copy's properties, an exception no front-end expects. It is staged as transient now."""
    from bridge.frontends.amqp.translate import property_values

    assert property_values({"persistent": "false", "amqp-delivery-mode": "3"})[3] in (None, 1)
    data = (CORPUS / "amqp" / "regression-delayed-publish-delivery-mode-3").read_bytes()
    targets.amqp(data)  # returns, or raises the protocol error the target allows


def test_a_header_decimal_pika_cannot_write_keeps_the_strings_not_a_crash() -> None:
    """Found by the amqp target: a delayed publish whose header table holds a decimal pika
    cannot write back (its unscaled value past 32 bits) raised struct.error where the staged
    copy's typed table is written. The table's types are then not kept; the strings are."""
    import decimal

    from adapters import amqp_types

    assert amqp_types.encode({"d": decimal.Decimal("1E+20"), "n": 1}) is None
    data = (CORPUS / "amqp" / "regression-delayed-publish-decimal-out-of-range").read_bytes()
    targets.amqp(data)
