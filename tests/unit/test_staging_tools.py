"""The staged-message tools' cancel and release against the in-memory broker: found wherever the
message waits, patient with a message the engine holds for a moment, never losing one."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest

from adapters.base import Message
from bridge.staging import envelope, listing, operations
from policies.errors import PutRefused
from policies.reasons import MQRC_UNKNOWN_OBJECT_NAME
from tests.unit.memory_broker import MemoryBroker
from tests.unit.test_staging_engine import LAYOUT, T0, TARGET, stage


class HeldForAWhile(MemoryBroker):
    """A broker whose consumer elsewhere (the engine) holds every message for the first
    ``busy`` takes: browsing sees it, taking it gets nothing, as on ActiveMQ."""

    def __init__(self, busy: int) -> None:
        super().__init__("activemq")
        self.busy = busy
        self.takes = 0

    def take(
        self, queue: str, header: str, value: str, then: Callable[[Message], None] | None = None
    ) -> Message | None:
        self.takes += 1
        if self.takes <= self.busy:
            return None
        return super().take(queue, header, value, then)


def staged_count(broker: MemoryBroker) -> int:
    # No engine runs to answer: a listing need not wait for one.
    return sum(1 for _ in listing.rows(broker, LAYOUT, answer_s=0.05))


def test_cancel_finds_the_message_on_whichever_level_it_waits() -> None:
    broker = MemoryBroker()
    broker.connect()
    ids = [stage(broker, delay_ms=d, now=T0) for d in (5_000, 3_600_000, 30 * 86_400_000)]
    taken = operations.take(broker, LAYOUT, ids[1])
    assert taken is not None and taken.headers[envelope.MESSAGE_ID] == ids[1]
    assert {r.message_id for r in listing.rows(broker, LAYOUT)} == {ids[0], ids[2]}
    assert operations.take(broker, LAYOUT, ids[1]) is None
    assert operations.take(broker, LAYOUT, "ID:never-staged") is None


def test_cancel_waits_while_the_engine_holds_the_message() -> None:
    broker = HeldForAWhile(busy=3)
    broker.connect()
    message_id = stage(broker, delay_ms=86_400_000, now=T0)
    assert operations.take(broker, LAYOUT, message_id, patience_s=5.0) is not None
    assert broker.takes == 4 and staged_count(broker) == 0


def test_cancel_gives_up_with_a_clear_error_and_leaves_the_message_staged() -> None:
    broker = HeldForAWhile(busy=10**6)
    broker.connect()
    message_id = stage(broker, delay_ms=86_400_000, now=T0)
    with pytest.raises(operations.Busy, match=f"{message_id} .* held by the staging engine"):
        operations.take(broker, LAYOUT, message_id, patience_s=0.3)
    assert staged_count(broker) == 1


def test_release_now_puts_the_original_to_its_target_then_removes_the_staged_copy() -> None:
    broker = MemoryBroker()
    broker.connect()
    message_id = stage(broker, delay_ms=86_400_000, now=T0, body=b"payload")
    assert operations.release_now(broker, LAYOUT, message_id)
    ((_, destination, message),) = broker.published
    assert destination == TARGET and message.body == b"payload"
    assert message.headers["x-app"] == "kept"
    assert message.headers[envelope.MESSAGE_ID] == message_id
    assert envelope.TARGET not in message.headers and envelope.DUE not in message.headers
    assert staged_count(broker) == 0


def test_release_now_refused_by_the_target_keeps_the_staged_copy() -> None:
    broker = MemoryBroker()
    broker.connect()
    broker.refuse(TARGET, MQRC_UNKNOWN_OBJECT_NAME, "no such queue")
    message_id = stage(broker, delay_ms=86_400_000, now=T0)
    with pytest.raises(PutRefused):
        operations.release_now(broker, LAYOUT, message_id)
    assert staged_count(broker) == 1


def test_release_now_of_an_unknown_message_is_false() -> None:
    broker = MemoryBroker()
    broker.connect()
    assert operations.release_now(broker, LAYOUT, "ID:never-staged",
                             answer_s=0.05) is None
    assert [d for _, d, _ in broker.published] == ["/topic/" + LAYOUT.control], "only the order"


class NoBrowsing(MemoryBroker):
    """Browsing a staging queue reads every message on it: at 10 million that takes hours."""

    def browse(self, queue: str) -> Iterator[Message]:
        raise AssertionError(f"count browsed {queue}")


@pytest.mark.parametrize("name", ["rabbitmq", "activemq"])
def test_count_adds_the_brokers_own_counts_without_reading_a_message(name: str) -> None:
    broker = NoBrowsing(name)
    broker.connect()
    for d in (5_000, 3_600_000, 3_600_000, 30 * 86_400_000):
        stage(broker, delay_ms=d, now=T0)
    assert listing.count(broker, LAYOUT, answer_s=0.1) == 4
    assert broker.counts == 1


class FirstPageOnly(MemoryBroker):
    """ActiveMQ: a browser sees only the first ``page`` messages of a queue."""

    def __init__(self, page: int) -> None:
        super().__init__("activemq")
        self.page = page

    def browse(self, queue: str) -> Iterator[Message]:
        return itertools.islice(super().browse(queue), self.page)


def test_a_listing_the_broker_cuts_short_names_the_queues_and_what_it_did_not_show() -> None:
    for page, listed in ((2, 3), (100, 6)):
        broker = FirstPageOnly(page)
        broker.connect()
        for _ in range(5):
            stage(broker, delay_ms=3_600_000, now=T0)
        stage(broker, delay_ms=5_000, now=T0)
        unseen: dict[str, tuple[int, int]] = {}
        assert len(list(listing.rows(broker, LAYOUT, unseen=unseen, answer_s=0.05))) == listed
        if page == 100:
            assert unseen == {}
            continue
        ((queue, (shown, counted)),) = unseen.items()
        assert (shown, counted) == (2, 5)
        warning = listing.unseen_warning(unseen)
        assert "2 of the 5 messages" in warning and queue in warning


def test_the_listing_reads_the_queues_in_the_order_messages_move_through_them() -> None:
    from bridge.staging.levels import Layout
    from bridge.staging.listing import scan_order

    for layout in (Layout("jbt-listing"), Layout("jbt-listing", second_levels=True)):
        order = scan_order(layout)
        assert order[-1] == layout.ready and set(order) == set(layout.queues)
        dwells = [layout.dwell_of(q) for q in order[:-1]]
        assert dwells == sorted(dwells, reverse=True)  # hops go to shorter levels only
