"""Operators' orders to the running engines (cancel, release now) against the in-memory broker:
the engine carries an order out on the copy it holds and answers; it remembers the order for a
copy it meets later; the tools use the queues first, then the engines."""

from __future__ import annotations

import pytest

from adapters.base import Held, Message
from bridge.staging import envelope, listing, operations, orders
from bridge.staging.engine import DECLARE_LATER_MS
from bridge.staging.orders import Order, OrderAction, Orders
from policies.reasons import MQRC_NOT_AUTHORIZED
from tests.unit.memory_broker import MemoryBroker
from tests.unit.test_staging_engine import (
    LAYOUT,
    SECONDS,
    T0,
    TARGET,
    Clock,
    drive,
    engine_for,
    releases,
    stage,
)

REPLY = LAYOUT.control + ".reply.test"


def give(broker: MemoryBroker, action: OrderAction, message_id: str) -> Order:
    """What ``operations.ask_engines`` publishes."""
    order = Order.new(action, message_id, REPLY)
    broker.publish(orders.destination(LAYOUT.control), order.message())
    return order


def answers(broker: MemoryBroker, order: Order) -> list[str | None]:
    return [order.answered(m.headers) for _, m in broker.delivered(orders.destination(REPLY))]


def staged_left(broker: MemoryBroker) -> int:
    return sum(broker.depth(q) for q in LAYOUT.queues)


# -- the order and its memory -------------------------------------------------------------------


def test_an_order_travels_as_headers_and_is_answered_by_its_id() -> None:
    order = Order.new(OrderAction.RELEASE, "ID:m-1", REPLY)
    assert Order.of(order.message().headers) == order
    assert order.answered(order.answer("released").headers) == "released"
    other = Order.new(OrderAction.RELEASE, "ID:m-1", REPLY)
    assert order.answered(other.answer("released").headers) is None
    for bad in ({}, {orders.ORDER: "delete", envelope.MESSAGE_ID: "x", orders.ORDER_ID: "1"},
                {orders.ORDER: "cancel", orders.ORDER_ID: "1"}):
        with pytest.raises(ValueError):
            Order.of(bad)


def test_orders_are_kept_for_a_while_and_at_most_so_many() -> None:
    kept = Orders(keep_ms=1_000, keep_max=3)
    for i in range(5):
        kept.add(Order.new(OrderAction.CANCEL, f"m{i}", REPLY), now_ms=i)
    assert len(kept) == 3 and kept.get("m1", 10) is None and kept.get("m2", 10) is not None
    assert kept.get("m4", 1_003) is not None and kept.get("m4", 1_004) is None
    kept.forget(2_000)
    assert not kept


# -- the engine ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [LAYOUT, SECONDS], ids=["binary", "seconds"])
def test_cancel_of_a_message_the_engine_holds_in_a_level_buffer(layout) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, layout=layout)
    message_id = stage(broker, delay_ms=5_000, now=T0, layout=layout)
    kept = stage(broker, delay_ms=5_000, now=T0, layout=layout)
    engine.step(T0)
    assert broker.held_count == 2, "taken ahead by the level subscription"
    order = give(broker, OrderAction.CANCEL, message_id)
    clock.now = T0 + 10
    drive(engine, clock, T0 + 10_000)
    assert releases(broker) == {kept: [T0 + 5_000]}
    assert stats.cancelled == 1 and stats.released == 1
    assert answers(broker, order) == ["cancelled"]
    assert broker.held_count == 0 and staged_left(broker) == 0


def test_release_now_of_a_message_held_for_release_is_early_on_purpose() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    message_id = stage(broker, delay_ms=800, now=T0)  # the ready queue: held in the heap
    engine.step(T0)
    assert [due for due, *_ in engine.holding.heap] == [T0 + 800]
    order = give(broker, OrderAction.RELEASE, message_id)
    clock.now = T0 + 100
    engine.step(clock.now)
    [(t, released)] = broker.delivered(TARGET)
    assert t == T0 + 100 and released.headers["x-app"] == "kept"
    assert envelope.DUE not in released.headers
    assert stats.released == 1 and sum(stats.lateness_counts) == 0, "not a lateness"
    assert answers(broker, order) == ["released"]
    drive(engine, clock, T0 + 2_000)
    assert len(broker.delivered(TARGET)) == 1 and not engine.holding.heap


def test_an_order_for_a_message_not_held_is_carried_out_when_the_engine_meets_it() -> None:
    """A copy that was between two queues when the order came (or a crash's duplicate) is met
    later: the engine remembers the order, and answers when it carries it out."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, quick=False)  # sees what comes
    engine.step(T0)
    message_id = "ID:on-its-way"
    order = give(broker, OrderAction.CANCEL, message_id)
    clock.now = T0 + 1
    engine.step(clock.now)
    assert answers(broker, order) == []
    for delay_ms in (200_000, 3_000):  # a peeked level, a streamed one
        staged_id = stage(broker, delay_ms=delay_ms, now=clock.now)
        copy = broker.queues[LAYOUT.queue_for(delay_ms)].pop()
        copy.message.headers[envelope.MESSAGE_ID] = message_id
        broker.queues[LAYOUT.queue_for(delay_ms)].append(copy)
        assert staged_id != message_id
    other = stage(broker, delay_ms=3_000, now=clock.now)
    drive(engine, clock, T0 + 300_000)
    assert set(releases(broker)) == {other} and stats.cancelled == 2
    assert answers(broker, order) == ["cancelled", "cancelled"]
    assert staged_left(broker) == 0


def test_an_order_makes_the_engine_look_at_its_peeked_levels_at_once() -> None:
    """ActiveMQ pushes a peeked level's head to the engine long before the engine looks at it;
    no one else can take it meanwhile."""
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    message_id = stage(broker, delay_ms=7 * 86_400_000, now=T0)
    engine.step(T0 - DECLARE_LATER_MS)  # connected: the long levels are declared after
    engine.step(T0)
    engine.step(T0)
    order = give(broker, OrderAction.CANCEL, message_id)
    clock.now = T0 + 5
    engine.step(clock.now)
    assert answers(broker, order) == ["cancelled"] and stats.cancelled == 1
    assert staged_left(broker) == 0


def test_a_remembered_order_lapses() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    engine.step(T0)
    give(broker, OrderAction.CANCEL, "ID:late")
    engine.step(T0)
    assert engine.orders.standing.get("ID:late", T0 + orders.KEEP_MS - 1)
    clock.now = T0 + orders.KEEP_MS
    staged_id = stage(broker, delay_ms=2_000, now=clock.now)
    copy = broker.queues[LAYOUT.queue_for(2_000)].pop()
    copy.message.headers[envelope.MESSAGE_ID] = "ID:late"
    broker.queues[LAYOUT.queue_for(2_000)].append(copy)
    drive(engine, clock, clock.now + 3_000)
    assert set(releases(broker)) == {"ID:late"} and stats.cancelled == 0
    assert staged_id != "ID:late"


def test_release_of_a_message_whose_ttl_ran_out_answers_expired() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock)
    message_id = stage(broker, delay_ms=5_000, now=T0, ttl_ms=3_000)  # as if a clock stepped
    engine.step(T0)
    assert broker.held_count == 1
    order = give(broker, OrderAction.RELEASE, message_id)
    clock.now = T0 + 3_500
    engine.step(clock.now)
    assert broker.delivered(TARGET) == [] and stats.expired == 1 and stats.released == 0
    assert answers(broker, order) == ["expired"]


def test_an_engine_that_may_not_listen_warns_and_runs_on() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    broker.refuse_listen = MQRC_NOT_AUTHORIZED
    engine, _, sink = engine_for(broker, clock)
    message_id = stage(broker, delay_ms=2_000, now=T0)
    drive(engine, clock, T0 + 3_000)
    assert set(releases(broker)) == {message_id}
    assert any("cannot listen to the control topic" in str(c) for c in sink.calls)


def test_junk_on_the_control_topic_is_ignored() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, sink = engine_for(broker, clock)
    engine.step(T0)
    broker.publish(orders.destination(LAYOUT.control), Message({"a": "b"}, b"?"))
    message_id = stage(broker, delay_ms=1_000, now=T0)
    drive(engine, clock, T0 + 2_000)
    assert set(releases(broker)) == {message_id}
    assert any("ignored a message on the control topic" in str(c) for c in sink.calls)


# -- the tools ----------------------------------------------------------------------------------


class EngineHolds(MemoryBroker):
    """A broker where a running engine holds ``held_ids``: not on the queues, and answered for
    when ordered (as the engine does on a connection of its own)."""

    def __init__(self, held_ids: dict[str, str]) -> None:
        super().__init__()
        self.held_ids = held_ids  # message id -> what the engine does ("cancelled", ...)
        self.orders: list[Order] = []

    def publish(self, destination: str, message):  # type: ignore[no-untyped-def]
        super().publish(destination, message)
        if destination == orders.destination(LAYOUT.control):
            order = Order.of(message.headers)
            self.orders.append(order)
            if order.message_id in self.held_ids and order.reply_topic:
                answer = order.answer(self.held_ids[order.message_id])
                self._heard.append(Held(order.reply_topic, answer, None))


def test_tool_takes_from_the_queue_without_asking_the_engines() -> None:
    broker = EngineHolds({})
    broker.connect()
    message_id = stage(broker, delay_ms=86_400_000, now=T0)
    outcome = operations.cancel(broker, LAYOUT, message_id, answer_s=5.0)
    assert outcome is not None and (outcome.done, outcome.by_engine) == ("cancelled", False)
    assert outcome.staged is not None  # the copy it took, for its journal event
    assert outcome.staged.headers["jms-bridge-message-id"] == message_id
    assert broker.orders == [] and staged_left(broker) == 0


def test_tool_orders_the_engine_that_holds_the_message() -> None:
    broker = EngineHolds({"ID:held": "cancelled", "ID:gone": "expired"})
    broker.connect()
    outcome = operations.cancel(broker, LAYOUT, "ID:held", answer_s=5.0)
    assert outcome == operations.OrderOutcome("cancelled", by_engine=True) and outcome.as_asked
    assert [o.action for o in broker.orders] == [OrderAction.CANCEL]
    expired = operations.release_now(broker, LAYOUT, "ID:gone", answer_s=5.0)
    assert expired is not None and not expired.as_asked
    assert "time to live" in expired.describe("ID:gone")


def test_tool_finds_nothing_when_no_engine_answers() -> None:
    broker = EngineHolds({})
    broker.connect()
    assert operations.cancel(broker, LAYOUT, "ID:nowhere", answer_s=0.05) is None
    assert [o.message_id for o in broker.orders] == ["ID:nowhere"]


def test_tool_not_allowed_to_give_orders_looks_on_the_queues_only() -> None:
    broker = EngineHolds({"ID:held": "cancelled"})
    broker.connect()
    broker.refuse_listen = MQRC_NOT_AUTHORIZED
    assert operations.cancel(broker, LAYOUT, "ID:held", answer_s=5.0) is None
    assert broker.orders == []


# -- listing what the engines hold ---------------------------------------------------------------


def test_a_list_order_is_answered_with_what_the_engine_holds() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, _, _ = engine_for(broker, clock)
    soon = stage(broker, delay_ms=800, now=T0, body=b"123")  # ready: the heap
    level = stage(broker, delay_ms=5_000, now=T0)  # a streamed level: its buffer
    other = stage(broker, delay_ms=5_000, now=T0, target="/queue/other")
    stage(broker, delay_ms=7 * 86_400_000, now=T0)  # a peeked level: on its queue
    engine.step(T0)
    everything = give(broker, OrderAction.LIST, "")
    only = Order.new(OrderAction.LIST, "", REPLY, target="/queue/other")
    broker.publish(orders.destination(LAYOUT.control), only.message())
    one = Order.new(OrderAction.LIST, soon, REPLY)
    broker.publish(orders.destination(LAYOUT.control), one.message())
    clock.now = T0 + 1
    engine.step(clock.now)
    replies = {m.headers[orders.ORDER_ID]: orders.rows_of(m.body)
               for _, m in broker.delivered(orders.destination(REPLY))}
    listed = {r["message_id"]: r for r in replies[everything.order_id]}
    assert set(listed) == {soon, level, other}
    assert listed[soon] == {"message_id": soon, "target": TARGET, "due_ms": T0 + 800,
                            "size": 3, "queue": LAYOUT.ready}
    assert listed[level]["queue"] == LAYOUT.queue_for(5_000)
    assert [r["message_id"] for r in replies[only.order_id]] == [other]
    assert [r["message_id"] for r in replies[one.order_id]] == [soon]
    assert not engine.orders.standing, "a list order is not remembered"
    drive(engine, clock, T0 + 6_000)
    assert set(releases(broker)) == {soon, level}


class EngineLists(MemoryBroker):
    """A RabbitMQ-like broker with ``engines`` running engines on other connections, each
    answering a list order with ``held`` (message id -> due)."""

    def __init__(self, engines: int, held: dict[str, int]) -> None:
        super().__init__("rabbitmq")
        self.extra_consumers = {LAYOUT.ready: engines}
        self.held = held
        self.engines = engines

    def publish(self, destination: str, message):  # type: ignore[no-untyped-def]
        super().publish(destination, message)
        if destination != orders.destination(LAYOUT.control):
            return
        order = Order.of(message.headers)
        assert order.reply_topic is not None
        held = [Held(LAYOUT.ready, Message({envelope.MESSAGE_ID: m, envelope.TARGET: TARGET,
                                            envelope.DUE: str(due)}, b"xy"), None)
                for m, due in self.held.items()]
        for _ in range(self.engines):
            self._heard.append(Held(order.reply_topic, order.listing(held), None))


def test_list_adds_what_the_engines_hold_once_where_the_broker_does_not_show_it() -> None:
    broker = EngineLists(engines=2, held={"ID:held": T0 + 5_000})
    broker.connect()
    queued = stage(broker, delay_ms=86_400_000, now=T0)
    found = {r.message_id: r for r in listing.rows(broker, LAYOUT, answer_s=5.0)}
    assert set(found) == {queued, "ID:held"}
    assert found["ID:held"].due_ms == T0 + 5_000 and found["ID:held"].size == 2
    assert found["ID:held"].queue == LAYOUT.ready
    assert [r.message_id for r in listing.rows(broker, LAYOUT, message_id="ID:held",
                                              answer_s=5.0)] == ["ID:held"]


def test_list_asks_no_engine_when_none_runs_and_asks_them_on_activemq_too() -> None:
    idle = EngineLists(engines=0, held={"ID:held": T0})
    idle.connect()
    assert list(listing.rows(idle, LAYOUT, answer_s=5.0)) == []
    assert idle.published == []
    amq = MemoryBroker("activemq")
    amq.connect()
    amq.extra_consumers = {LAYOUT.ready: 1}
    stage(amq, delay_ms=86_400_000, now=T0)
    assert len(list(listing.rows(amq, LAYOUT, answer_s=0.2))) == 1
    # Asked whether the engine keeps a staged catalogue (it did not answer), then, after the
    # queues were read, for what it holds and moved meanwhile: ActiveMQ's browser does not
    # show every message a consumer holds, nor one moved onto a queue already read.
    [(_, destination, asked), (_, _, listed)] = amq.published
    assert destination == orders.destination(LAYOUT.control)
    assert asked.headers[orders.CATALOGUE] == "1"
    assert orders.CATALOGUE not in listed.headers and orders.MOVED_WITHIN in listed.headers
    assert list(listing.rows(amq, LAYOUT, scan=True)) and len(amq.published) == 3


def test_the_engine_listens_again_after_a_reconnect() -> None:
    clock = Clock()
    broker = MemoryBroker(clock=clock)
    engine, stats, _ = engine_for(broker, clock, backoff_s=(0.5, 1.0))
    engine.step(T0)
    broker.fail_next_poll()
    engine.step(T0 + 1)
    assert not broker.listening, "gone with the connection"
    message_id = stage(broker, delay_ms=5_000, now=T0)
    clock.now = T0 + 600
    engine.step(clock.now)
    assert broker.listening == {LAYOUT.control} and broker.held_count == 1
    order = give(broker, OrderAction.CANCEL, message_id)
    drive(engine, clock, T0 + 6_000)
    assert broker.delivered(TARGET) == [] and stats.cancelled == 1
    assert answers(broker, order) == ["cancelled"]
