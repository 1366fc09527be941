"""Differential test: policies.selector against ActiveMQ's own selector engine.

Thirty messages with known headers go to a fresh queue, straight to ActiveMQ through stomp.py
(no bridge). Every selector of tests/data/selectors.txt then browses the queue (``browser:
true``, all subscriptions on one connection at once), and the messages ActiveMQ delivers must be
the ones compile_selector(..., ACTIVEMQ) selects from the headers ActiveMQ delivers them with.

Where ActiveMQ departs from the JMS 2.0 spec, the bridge keeps the spec's answer: KNOWN_DEVIATIONS
lists those selectors with why, and asserts that ActiveMQ still answers differently, so that the
list cannot go stale.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import stomp

from policies.selector import ACTIVEMQ, compile_selector
from tests.integration.brokers import BROKERS, require

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).parents[1] / "data" / "selectors.txt"
TIMEOUT = 30.0

_NULL_EQUALS = ("ActiveMQ's = gives TRUE for two NULLs, and FALSE (so <> TRUE) for a value on "
                "the left and NULL on the right; JMS: unknown")
_NOT_PRECEDENCE = ("ActiveMQ binds NOT tighter than =, reading (NOT color) = 'red', and then "
                   "fails comparing a Boolean with a String; SQL-92 and JMS: NOT (color = 'red')")
_BOOLEAN_LEFT = ("ActiveMQ's string conversion casts the wrong side when the Boolean is on the "
                 "left (ClassCastException): it selects nothing")
_CONCATENATION = ("ActiveMQ's + concatenates a string property with anything; JMS allows no "
                  "strings in arithmetic, and ours is NULL")
KNOWN_DEVIATIONS = {
    "missing = missing": _NULL_EQUALS,
    "color = missing": _NULL_EQUALS,
    "size = missing": _NULL_EQUALS,
    "'a' <> missing": _NULL_EQUALS,
    "NOT (5 = missing)": _NULL_EQUALS,
    "TRUE = flag": _BOOLEAN_LEFT,
    "FALSE = flag": _BOOLEAN_LEFT,
    "size + 1 = '71'": _CONCATENATION,
    "color <> missing": _NULL_EQUALS,
    "NOT color = 'red'": _NOT_PRECEDENCE,
    "NOT color = 'red' AND size > 5": _NOT_PRECEDENCE,
    "NOT NOT color = 'red'": _NOT_PRECEDENCE,
}

SIZES = ["7", "5", "10", "-3", "0", "2147483647", "2147483648", "9223372036854775807", "7.5",
         "1e3", "abc", "", " 5", "+5", "007", "0x1F", "5L", None, "1000"]
PRICES = ["9.99", "10", "1e2", "-1.5", "NaN", "Infinity", "-Infinity", "1.5f", " 2.5 ", "abc",
          ".5", "5.", None, "10.0", "0.5"]
FLAGS = ["true", "TRUE", "false", "yes", "", None]
NAMES = ["abc", "a_c", "a%c", "ab", "", "a\\c", "Abc", "xabcx", "a'b", "über", "a.c", "a*c",
         None, "a[b]c", "x", "a!bc"]
COLORS = ["red", "green", "blue", "Red", "", None, "red ", "GREEN"]
TYPES = ["order", "invoice", None]


def message_headers(n: int) -> dict[str, str]:
    """The SEND headers of message ``n``: each property cycles through its list at its own step."""
    headers = {
        "n": str(n),
        "size": SIZES[n % len(SIZES)],
        "price": PRICES[(n * 7) % len(PRICES)],
        "flag": FLAGS[(n * 5) % len(FLAGS)],
        "name": NAMES[(n * 3) % len(NAMES)],
        "color": COLORS[n % len(COLORS)],
        "type": TYPES[n % len(TYPES)],
        "correlation-id": None if n % 4 == 0 else f"c-{n % 5}",
        "priority": str(n % 10),
        "timestamp": str(1_700_000_000_000 + 1000 * n),
        "persistent": "true" if n % 2 == 0 else None,
    }
    return {k: v for k, v in headers.items() if v is not None}


class _Collector(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.delivered: dict[str, set[str]] = {}
        self.headers: dict[str, dict[str, str]] = {}
        self.ended: set[str] = set()
        self.errors: list[str] = []

    def on_message(self, frame: Any) -> None:
        sub = frame.headers.get("subscription", "")
        with self.cv:
            if frame.headers.get("browser") == "end":
                self.ended.add(sub)
            else:
                self.delivered.setdefault(sub, set()).add(frame.headers["n"])
                if sub == "all":
                    self.headers[frame.headers["n"]] = dict(frame.headers)
            self.cv.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cv:
            self.errors.append(frame.headers.get("message", "") + " " + frame.body[:300])
            self.cv.notify_all()

    def wait(self, what: str, done: Any) -> None:
        deadline = time.monotonic() + TIMEOUT
        with self.cv:
            while not done():
                if self.errors:
                    pytest.fail(f"ActiveMQ refused a subscription: {self.errors}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    pytest.fail(f"timed out waiting for {what}")
                self.cv.wait(remaining)


def corpus() -> list[str]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def test_selector_corpus_agrees_with_activemq() -> None:
    broker = BROKERS["activemq"]
    require(broker)
    selectors = corpus()
    assert len(selectors) >= 200
    compiled = [compile_selector(s, ACTIVEMQ) for s in selectors]  # all valid for us too

    collector = _Collector()
    conn = stomp.Connection12([(broker.stomp_host, broker.stomp_port)], heartbeats=(0, 0),
                              vhost=broker.vhost)
    conn.set_listener("", collector)
    conn.connect(broker.user, broker.password, wait=True)
    queue = f"/queue/jbt-selector-{uuid.uuid4().hex[:12]}"
    count = 30
    try:
        for n in range(count):
            conn.send(queue, f"m{n}", headers=message_headers(n),
                      receipt="sent" if n == count - 1 else None)
        conn.subscribe(queue, id="all", ack="auto", headers={"browser": "true"})
        collector.wait("the plain browse", lambda: "all" in collector.ended)
        assert len(collector.headers) == count

        for i, selector in enumerate(selectors):
            conn.subscribe(queue, id=f"s{i}", ack="auto",
                           headers={"browser": "true", "selector": selector})
        collector.wait("every browse", lambda: len(collector.ended) == len(selectors) + 1)

        disagreements, stale = [], []
        for i, (selector, ours) in enumerate(zip(selectors, compiled, strict=True)):
            theirs = collector.delivered.get(f"s{i}", set())
            mine = {n for n, h in collector.headers.items() if ours.matches(h)}
            if selector in KNOWN_DEVIATIONS:
                if theirs == mine:
                    stale.append(selector)
            elif theirs != mine:
                disagreements.append(
                    f"{selector!r}: ActiveMQ {sorted(theirs, key=int)}, "
                    f"ours {sorted(mine, key=int)}"
                )
        assert not disagreements, "\n".join(disagreements)
        assert not stale, f"ActiveMQ agrees now; drop them from KNOWN_DEVIATIONS: {stale}"
    finally:
        with collector.cv:
            collector.ended.clear()
        conn.subscribe(queue, id="drain", ack="auto")  # leave the queue empty
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(collector.delivered.get("drain", ())) < count:
            time.sleep(0.05)
        conn.disconnect()


def test_activemq_refuses_what_we_refuse() -> None:
    """A few selectors both engines reject: the connection survives ActiveMQ's ERROR frame."""
    broker = BROKERS["activemq"]
    require(broker)
    bad = ["color > 'x'", "size = NULL", "color IN ()", "name LIKE 'a' ESCAPE 'xy'",
           "JMSPriority >> 4", "color = 'red", "1 + 1", "(color = 'red'"]
    for selector in bad:
        with pytest.raises(Exception, match="invalid selector at column"):
            compile_selector(selector)
    collector = _Collector()
    conn = stomp.Connection12([(broker.stomp_host, broker.stomp_port)], heartbeats=(0, 0),
                              vhost=broker.vhost)
    conn.set_listener("", collector)
    conn.connect(broker.user, broker.password, wait=True)
    queue = f"/queue/jbt-selector-{uuid.uuid4().hex[:12]}"
    try:
        for i, selector in enumerate(bad):
            conn.subscribe(queue, id=f"b{i}", ack="auto",
                           headers={"browser": "true", "selector": selector})
        deadline = time.monotonic() + TIMEOUT
        with collector.cv:
            while len(collector.errors) < len(bad) and time.monotonic() < deadline:
                collector.cv.wait(0.2)
        assert len(collector.errors) == len(bad), collector.errors
        assert all("InvalidSelectorException" in e for e in collector.errors)
    finally:
        conn.disconnect()
