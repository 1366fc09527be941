"""The staged catalogue against each real broker: ``staged list`` and ``cancel`` answered by a
running bridge from its catalogue, without reading the staging queues, and a staged cancel that
comes due before its message and drops it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

from adapters.base import Message, StagingBroker
from bridge.staging import envelope, listing, operations
from bridge.staging.levels import Layout
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.staging_util import private_bridges
from tests.integration.test_adapters import _adapter

HOUR_MS, DAY_MS = 3_600_000, 86_400_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(scope="module")
def catalogued(broker: Broker, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[Layout, BridgeProcess, StagingBroker]]:
    """A bridge of its own with a staged catalogue, and an adapter for the tools."""
    tmp = tmp_path_factory.mktemp("catalogue")
    with private_bridges(broker, tmp, extra=("--staged-catalogue", str(tmp / "staged.db"))) as (
            layout, [bridge]):
        adapter = _adapter(broker)
        adapter.connect()
        try:
            yield layout, bridge, adapter
        finally:
            adapter.close()


def staged(bridge: BridgeProcess, layout: Layout, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.app.cli", "staged", *args, "--broker", bridge.broker,
         "--upstream-stomp", f"stomp://{bridge.upstream}", "--staging-prefix", layout.prefix],
        capture_output=True, text=True, timeout=60)


def ids(adapter: StagingBroker, layout: Layout, **how: object) -> list[str]:
    return [r.message_id for r in listing.rows(adapter, layout, **how)]  # type: ignore[arg-type]


def test_list_and_cancel_answer_from_the_catalogue(
        broker: Broker, catalogued: tuple[Layout, BridgeProcess, StagingBroker]) -> None:
    layout, bridge, adapter = catalogued
    dest, other = (broker.queue_destination(f"jbt-{uuid.uuid4().hex[:12]}") for _ in range(2))
    conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
    for i, (to, delay) in enumerate([(dest, 2 * HOUR_MS), (dest, 30 * DAY_MS),
                                     (other, HOUR_MS)]):
        conn.send(to, f"m{i}", headers={"x-delay": str(delay), "receipt": f"r{i}"})
        assert inbox.wait_receipt(f"r{i}")
    conn.disconnect()
    # A staged copy the bridge did not stage (another bridge without a catalogue, say): on the
    # queues, not in the catalogue.
    queue = layout.queue_for(3 * HOUR_MS)
    headers = dict(envelope.staged_headers(
        [("persistent", "true")], adapter.format, target=dest,
        staging_destination=adapter.format.client_destination(queue),
        due_ms=now_ms() + 3 * HOUR_MS, sent_ms=now_ms(), expires_ms=None, drop=()))
    del headers["destination"]
    adapter.publish(adapter.format.client_destination(queue), Message(headers, b"foreign"))
    foreign = headers[envelope.MESSAGE_ID]

    deadline = time.monotonic() + 10
    while (len(rows := listing.catalogued_rows(adapter, layout, target=dest, message_id=None,
                                             wait_s=2.0) or []) < 2
           and time.monotonic() < deadline):
        time.sleep(0.1)  # the engine subscribes; the catalogue's writer commits
    assert len(rows) == 2, rows
    found = ids(adapter, layout, target=dest)
    assert found == [r.message_id for r in rows] and foreign not in found, found
    two_hours, thirty_days = found  # soonest first
    assert set(ids(adapter, layout, target=dest, scan=True)) == {two_hours, thirty_days, foreign}
    assert ids(adapter, layout, target=other) != []

    started = time.monotonic()
    cancelled = staged(bridge, layout, "cancel", thirty_days)
    took = time.monotonic() - started
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert cancelled.stdout.startswith(
        f"cancelled {thirty_days}: it stays on the staging queues until it is due"), \
        cancelled.stdout
    listed = staged(bridge, layout, "list", "--target", dest, "--json")
    assert [r["message_id"] for r in json.loads(listed.stdout)] == [two_hours], listed.stderr
    # On the queues: the staged cancel (never listed), the others, and the message itself
    # unless the engine met it since (it heads its level: the engine then drops it at once, by
    # the order it was told).
    counted = listing.count(adapter, layout)
    after = set(ids(adapter, layout, target=dest, scan=True))
    assert after - {thirty_days} == {two_hours, foreign}, after
    # The other target's and the cancel too. A count adds the queues' depths to what the
    # engine holds and let go of while it counted (a level head it looked at and put back):
    # it may count one twice, never miss one; the listing above is the exact answer.
    assert counted >= len(after) + 2, counted
    # Three rows added by the bridge's process; the engine's took one out on the order, kept
    # the order, and took the row out again if it dropped the message.
    # (the engine may meet the cancelled message, and drop it, any moment after the browse)
    written = bridge.settled_metric("jms_bridge_catalogue_written_total", 6)
    assert written == 6 or (thirty_days in after and written == 5), written
    assert bridge.metric("jms_bridge_catalogue_dropped_total") == 0
    print(f"{broker.name}: cancel from the catalogue took {took:.2f} s (a new process)")
    # The admin API: the same, counted once (by the engine, when it drops the message).
    status, body = bridge.http(f"/staged?target={dest}")
    assert status == 200 and [r["message_id"] for r in json.loads(body)] == [two_hours]
    status, body = bridge.http(f"/staged?target={dest}&scan=1")
    assert status == 200 and {r["message_id"] for r in json.loads(body)} == after
    cancelled_before = bridge.metric("jms_bridge_staging_cancelled_total")
    status, body = bridge.http(f"/staged/{two_hours}/cancel", "POST")
    assert status == 200, body
    assert json.loads(body)["cancelled"] == two_hours and json.loads(body)["due_ms"] > now_ms()
    # Alone on its level, it heads it: the engine looks at once and drops it.
    once = cancelled_before + 1
    assert bridge.settled_metric("jms_bridge_staging_cancelled_total", once) == once
    time.sleep(0.5)
    assert bridge.metric("jms_bridge_staging_cancelled_total") == once  # not twice


def test_a_staged_cancel_drops_its_message_when_it_comes_due(
        broker: Broker, catalogued: tuple[Layout, BridgeProcess, StagingBroker]) -> None:
    """The staged cancel alone (no order told to the engines at once): released to the control
    topic before its message is due, it makes the engine drop the message."""
    layout, bridge, adapter = catalogued
    dest = broker.queue_destination(f"jbt-{uuid.uuid4().hex[:12]}")
    conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
    conn.subscribe(dest, id="s", ack="auto")
    sent = now_ms()
    conn.send(dest, "never", headers={"x-delay": "4000", "receipt": "a"})
    conn.send(dest, "kept", headers={"x-delay": "4000", "receipt": "b"})
    assert inbox.wait_receipt("a") and inbox.wait_receipt("b")
    victim = next(r.message_id for r in listing.rows(adapter, layout, target=dest)
                  if r.size == len("never"))
    before = bridge.metric("jms_bridge_staging_cancelled_total")
    where, copy, _ = operations.staged_cancel(adapter.format, layout, victim, due_ms=sent + 1_500,
                                         now_ms=now_ms())
    adapter.publish(where, copy)
    got = inbox.take(1, timeout=8)
    assert bridge.settled_metric("jms_bridge_staging_cancelled_total", before + 1) == before + 1
    got += inbox.take(1, timeout=0.5)  # due with it: released with it, if at all
    conn.disconnect()
    assert [m.body for m in got] == ["kept"]
    assert "ignored a message on the control topic" not in bridge.log()
