"""The staged catalogue (``bridge.staging.catalogue``): what it records from outcomes, what the
engine answers from it, and the staged cancel that reaches a message due long after."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from adapters.base import Held, Message
from bridge.staging import operations, orders
from bridge.staging.catalogue import (
    Catalogue,
    CatalogueSink,
    CatalogueWriter,
    Entry,
    changes,
    open_file,
)
from bridge.staging.orders import CANCEL_LEAD_MS, Order, OrderAction
from bridge.staging.outcomes import Kind, MessageOutcome
from policies.errors import ConfigError
from tests.unit.memory_broker import MemoryBroker
from tests.unit.test_staging_engine import LAYOUT, T0, TARGET, Clock, drive, engine_for, releases
from tests.unit.test_staging_engine import stage as put_staged
from tests.unit.test_staging_orders import REPLY, staged_left

DAY_MS = 86_400_000


def settled(writer: CatalogueWriter, done: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while writer.written < done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.written >= done, (writer.written, writer.last_error)


def staged(message_id: str, due_ms: int, target: str = TARGET, at_ms: int = T0) -> MessageOutcome:
    return MessageOutcome(Kind.STAGED, at_ms, message_id, target, due_ms, queue="q", size=7)


def test_outcomes_add_and_take_out_rows() -> None:
    adds, gone = changes([
        staged("a", T0 + 10),
        MessageOutcome(Kind.REDELIVERED, T0, "b", "/queue/r", T0 + 5_000, size=2),
        MessageOutcome(Kind.REDELIVERED, T0, "c", "/queue/r", T0),  # at once: not staged
        MessageOutcome(Kind.RELEASED, T0, "d", TARGET, T0),
        MessageOutcome(Kind.CANCELLED, T0, "e", TARGET, T0),
        MessageOutcome(Kind.HOPPED, T0, count=4),
        MessageOutcome(Kind.RETRIED, T0, "f", TARGET, T0),
    ])
    assert adds == [Entry("a", TARGET, T0 + 10, 7), Entry("b", "/queue/r", T0 + 5_000, 2)]
    assert gone == ["d", "e"]


def test_rows_are_written_found_by_id_and_target_and_never_shown_past_due(
        tmp_path: Path) -> None:
    path = str(tmp_path / "c.db")
    writer = CatalogueWriter(path).start()
    sink = CatalogueSink(writer)
    sink([staged("a", T0 + 3_000), staged("b", T0 + 1_000), staged("c", T0 + 2_000, "/queue/o")])
    sink([MessageOutcome(Kind.RELEASED, T0, "b", TARGET, T0 + 1_000)])
    settled(writer, 4)
    reader = Catalogue(path, writer)
    assert [e.message_id for e in reader.entries(now_ms=T0)] == ["c", "a"]
    assert [e.message_id for e in reader.entries(now_ms=T0, target=TARGET)] == ["a"]
    assert reader.entries(now_ms=T0, message_id="c") == [Entry("c", "/queue/o", T0 + 2_000, 7)]
    assert [e.message_id for e in reader.entries(now_ms=T0 + 2_000)] == ["a"]  # c is due
    reader.forget(["a"])
    settled(writer, 5)
    assert [e.message_id for e in reader.entries(now_ms=T0)] == ["c"]
    reader.close()


def test_two_processes_writers_share_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "c.db")
    bridge, engine = CatalogueWriter(path).start(), CatalogueWriter(path).start()
    for i in range(200):
        CatalogueSink(bridge)([staged(f"m{i}", T0 + 1_000 + i)])
        if i % 2:
            CatalogueSink(engine)([MessageOutcome(Kind.RELEASED, T0, f"m{i - 1}", TARGET, T0)])
    settled(bridge, 200)
    settled(engine, 100)
    left = Catalogue(path).entries(now_ms=T0)
    assert len(left) in range(100, 201) and all(e.message_id.startswith("m") for e in left)
    bridge.close()
    engine.close()


def test_a_file_sqlite_cannot_use_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-db"
    bad.write_bytes(b"this is not SQLite" * 100)
    with pytest.raises(ConfigError, match=r"staged-catalogue .*not-a-db: SQLite cannot use it"):
        open_file(str(bad))


def test_a_list_order_answers_for_the_deliveries_that_came_with_it() -> None:
    """An order heard in the same poll as deliveries is answered once they are held: a
    listing reads the queues first, where a delivery on its way to the engine shows
    nowhere, so an answer made before it was taken in left the message out."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock)
    engine.step(T0)
    soon = put_staged(broker, delay_ms=800, now=T0)
    order = Order.new(OrderAction.LIST, "", REPLY, target=TARGET)
    broker.publish(orders.destination(LAYOUT.control), order.message())
    clock.now = T0 + 1
    engine.step(clock.now)  # (the memory broker hands out what was heard first)
    (reply,) = [m for _, m in broker.delivered(orders.destination(REPLY))]
    assert [r["message_id"] for r in orders.rows_of(reply.body)] == [soon]


def test_a_list_order_asking_for_the_catalogue_gets_its_rows(tmp_path: Path) -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    path = str(tmp_path / "c.db")
    writer = CatalogueWriter(path).start()
    engine, _, _ = engine_for(broker, clock, catalogue=Catalogue(path, writer))
    soon = put_staged(broker, delay_ms=800, now=T0)  # held: answered from the heap
    far = put_staged(broker, delay_ms=7 * DAY_MS, now=T0)
    CatalogueSink(writer)([staged(far, T0 + 7 * DAY_MS), staged("other", T0 + DAY_MS, "/q/o")])
    settled(writer, 2)
    engine.step(T0)
    asked = Order.new(OrderAction.LIST, "", REPLY, target=TARGET, catalogue=True)
    plain = Order.new(OrderAction.LIST, "", REPLY, target=TARGET)
    for order in (asked, plain):
        broker.publish(orders.destination(LAYOUT.control), order.message())
    clock.now = T0 + 1
    engine.step(clock.now)
    deadline = time.monotonic() + 5  # the catalogue's reader thread answers the first
    while len(broker.delivered(orders.destination(REPLY))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
        engine.step(clock.now)
    replies = {m.headers[orders.ORDER_ID]: m for _, m in broker.delivered(
        orders.destination(REPLY))}
    assert [r["message_id"] for r in orders.rows_of(replies[asked.order_id].body)] == [soon, far]
    assert replies[asked.order_id].headers[orders.CATALOGUE] == "1"
    assert [r["message_id"] for r in orders.rows_of(replies[plain.order_id].body)] == [soon]
    assert orders.CATALOGUE not in replies[plain.order_id].headers
    # A cancel order takes the row out of every engine's catalogue.
    broker.publish(orders.destination(LAYOUT.control),
                   Order.new(OrderAction.CANCEL, far, None).message())
    clock.now = T0 + 2
    engine.step(clock.now)
    settled(writer, 3)
    assert [e.message_id for e in Catalogue(path).entries(now_ms=T0)] == ["other"]
    engine.catalogue.close()  # type: ignore[union-attr]


def test_an_order_travels_in_a_body_as_a_staged_cancel_releases_it() -> None:
    order = Order.new(OrderAction.CANCEL, "ID:victim", None)
    assert Order.of_message(Message({"content-type": "application/json"},
                                    json.dumps(order.headers()).encode())) == order
    for body in (b"{not json", b"[1]", b'{"a": "b"}'):
        with pytest.raises(ValueError):
            Order.of_message(Message({}, body))


def test_a_staged_cancel_comes_due_before_its_message_and_drops_it() -> None:
    """Past the engine's memory of an order (KEEP_MS): the cancel waits on the staging queues
    and is put on the control topic CANCEL_LEAD_MS before the message is due."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    broker.connect()
    victim = put_staged(broker, delay_ms=3 * DAY_MS, now=T0)
    kept = put_staged(broker, delay_ms=3 * DAY_MS, now=T0)
    operations.stage_cancel(broker, LAYOUT, victim, due_ms=T0 + 3 * DAY_MS - CANCEL_LEAD_MS,
                       now_ms=T0)
    assert staged_left(broker) == 3
    # Started after the cancel, the engine did not hear it told: only the staged one works.
    engine, stats, _ = engine_for(broker, clock)
    drive(engine, clock, T0 + 3 * DAY_MS + 10_000)
    assert set(releases(broker)) == {kept}
    assert stats.cancelled == 1 and staged_left(broker) == 0


def test_cancel_of_a_catalogued_message_due_later_is_staged(tmp_path: Path) -> None:
    """The tool's side, with an engine answering from its catalogue (as the integration tests
    do against the real brokers)."""

    class Answers(MemoryBroker):
        def __init__(self, entries: list[Entry]) -> None:
            super().__init__()
            self.entries = entries

        def consumers(self, queue: str) -> int:
            return 1

        def publish(self, destination, message):  # type: ignore[no-untyped-def]
            super().publish(destination, message)
            if destination == orders.destination(LAYOUT.control):
                order = Order.of(message.headers)
                if order.action is OrderAction.LIST and order.reply_topic:
                    found = [e for e in self.entries if e.message_id == order.message_id]
                    answer = order.listing([], found)
                    self._heard.append(Held(order.reply_topic, answer, None))

    now = time.time_ns() // 1_000_000
    broker = Answers([Entry("ID:far", TARGET, now + DAY_MS, 3),
                      Entry("ID:near", TARGET, now + 60_000, 3)])
    broker.connect()
    outcome = operations.cancel(broker, LAYOUT, "ID:far", answer_s=2.0)
    assert outcome is not None and outcome.done == "cancelled" and outcome.due_ms == now + DAY_MS
    assert "dropped then, not delivered" in outcome.describe("ID:far")
    assert staged_left(broker) == 1  # the staged cancel
    near = operations.cancel(broker, LAYOUT, "ID:near", answer_s=0.2)
    assert near is None  # due within the lead: the queues and the engines, as before


def test_an_engine_restarted_remembers_the_orders_it_heard(tmp_path: Path) -> None:
    """A staged cancel comes due 5 minutes before its message: an engine restarted in between
    must still drop the message."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    path = str(tmp_path / "c.db")
    first_writer = CatalogueWriter(path).start()
    first, _, _ = engine_for(broker, clock, catalogue=Catalogue(path, first_writer))
    first.step(T0)
    broker.publish(orders.destination(LAYOUT.control),
                   Order.new(OrderAction.CANCEL, "ID:later", None).message())
    clock.now = T0 + 1
    first.step(clock.now)
    settled(first_writer, 2)  # the row taken out (none), the order kept
    first.catalogue.close()  # type: ignore[union-attr]
    broker.close()  # the engine is gone: what it held goes back
    broker.connect()
    clock.now = T0 + 60_000
    victim = put_staged(broker, delay_ms=120_000, now=clock.now)
    copy = broker.queues[LAYOUT.queue_for(120_000)].pop()
    copy.message.headers["jms-bridge-message-id"] = "ID:later"
    broker.queues[LAYOUT.queue_for(120_000)].append(copy)
    kept = put_staged(broker, delay_ms=120_000, now=clock.now)
    second, stats, _ = engine_for(broker, clock,
                                  catalogue=Catalogue(path, CatalogueWriter(path).start()))
    drive(second, clock, T0 + 200_000)
    assert set(releases(broker)) == {kept} and victim != "ID:later"
    assert stats.cancelled == 1
    second.catalogue.close()  # type: ignore[union-attr]


def test_rows_past_what_may_wait_are_dropped_and_counted(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.staging import catalogue

    monkeypatch.setattr(catalogue, "MAX_PENDING", 3)
    writer = CatalogueWriter(str(tmp_path / "c.db"))  # not started: nothing is written yet
    sink = CatalogueSink(writer)
    for i in range(5):
        sink([staged(f"m{i}", T0 + 1_000)])
    assert (writer.written, writer.dropped) == (0, 2)
    writer.start()
    settled(writer, 3)
    writer.close()
    assert [e.message_id for e in Catalogue(str(tmp_path / "c.db")).entries(now_ms=T0)] == [
        "m0", "m1", "m2"]


def _answered(broker: MemoryBroker, engine: object, clock: Clock, order: Order) -> Message:
    """The engine's answer to ``order`` (its catalogue's reader thread makes it)."""
    broker.publish(orders.destination(LAYOUT.control), order.message())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        engine.step(clock.now)  # type: ignore[attr-defined]
        for _, answer in broker.delivered(orders.destination(REPLY)):
            if answer.headers[orders.ORDER_ID] == order.order_id:
                return answer
        time.sleep(0.01)
    raise AssertionError("no answer")


@pytest.mark.parametrize("held_s", [0.3, 3.0])
def test_a_catalogue_answer_waits_for_the_bridges_writer_or_says_it_is_no_catalogue_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_s: float) -> None:
    """The bridge's process offers a staged message's row before its send is confirmed, but
    commits it later, on its writer thread (up to SQLite's busy wait later): an engine answering
    a list order from the catalogue meanwhile must list it, or answer without the catalogue
    (the tool then reads the queues)."""
    from bridge.staging import catalogue as catalogue_module

    monkeypatch.setattr(catalogue_module, "FLUSH_WAIT_S", 1.0)
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    path = str(tmp_path / "c.db")
    front = CatalogueWriter(path).start()  # the bridge's process's writer
    keeper = CatalogueWriter(path).start()  # the engine's process's writer
    engine, _, _ = engine_for(broker, clock, catalogue=Catalogue(path, keeper,
                                                                 feeds=[front.counters]))
    engine.step(T0)
    CatalogueSink(front)([staged("catgap-early", T0 + DAY_MS)])
    settled(front, 1)
    # Another writer holds the file: the bridge's writer waits on SQLite's busy wait with the
    # next row, which its sender has already been told is staged.
    blocker = open_file(path)
    blocker.execute("BEGIN IMMEDIATE")
    CatalogueSink(front)([staged("catgap-late", T0 + DAY_MS)])
    time.sleep(0.05)
    threading.Timer(held_s, lambda: blocker.execute("COMMIT")).start()
    clock.now = T0 + 1
    answer = _answered(broker, engine, clock, Order.new(OrderAction.LIST, "", REPLY, target=TARGET,
                                                        catalogue=True))
    listed = [r["message_id"] for r in orders.rows_of(answer.body)]
    if held_s < 1.0:  # caught up within the wait: answered from the catalogue, with it
        assert answer.headers.get(orders.CATALOGUE) == "2", (answer.headers, listed)
        assert listed == ["catgap-early", "catgap-late"]
    else:  # not caught up: no catalogue answer, and the tool reads the queues
        assert orders.CATALOGUE not in answer.headers, (answer.headers, listed)
    settled(front, 2)
    engine.catalogue.close()  # type: ignore[union-attr]
    front.close()
    blocker.close()


def test_rows_a_dead_writer_never_wrote_do_not_hold_the_answers_back(tmp_path: Path) -> None:
    """An engine process that died with rows offered: the next one's writer, on the same shared
    counters, does not wait for them."""
    from bridge.staging.catalogue import new_counters

    path = str(tmp_path / "c.db")
    counters = new_counters()
    dead = CatalogueWriter(path, counters)  # never started: its rows are never written
    CatalogueSink(dead)([staged("catgap-lost", T0 + DAY_MS)])
    reader = Catalogue(path, CatalogueWriter(path, counters).start())
    offered = reader.offered()
    assert offered == [1]
    assert reader.caught_up(offered, wait_s=0.0)
    reader.close()
