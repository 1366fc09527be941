"""An in-memory ``StagingBroker`` for unit tests of the staging engine.

Queues are deques; a held message is out of its queue until it is settled (acked) or given back,
and a lost connection gives everything held back at its old place, as a broker redelivers.
``name`` picks the peek semantics the adapters have: "rabbitmq" (a second peek returns the next
message) or "activemq" (it returns the same head). Everything the engine publishes is recorded
with the test clock's time, and faults are injected on demand, including a broker that refuses
puts to a destination (``refuse``: settle raises PutRefused for that move, as the adapters do:
"rabbitmq" stops there, "activemq" does the other moves and lists them in ``also_done``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from adapters import activemq, rabbitmq
from adapters.base import BrokerExpiry, Held, Message, Move, PutCheck, StagedFormat
from policies.errors import BrokerUnavailable, PutRefused, Refused
from policies.reasons import Reason


@dataclass(slots=True)
class _Entry:
    seq: int  # position in its queue, kept when it is held and given back
    message: Message


@dataclass(slots=True)
class _Holding:
    entry: _Entry
    held: Held
    subscribed: bool  # delivered by a subscription rather than a peek


class MemoryBroker:
    def __init__(
        self, name: str = "rabbitmq", *, clock: Callable[[], int] = lambda: 0,
        realtime: bool = False,
    ) -> None:
        self.name = name
        self.format: StagedFormat = {"rabbitmq": rabbitmq.FORMAT, "activemq": activemq.FORMAT}[name]
        self.clock = clock
        self.realtime = realtime  # poll sleeps its timeout when nothing arrives (thread tests)
        # As the adapters: ActiveMQ's browse shows the messages consumers hold.
        self.sees_held = name == "activemq"
        self.queues: dict[str, deque[_Entry]] = {}
        self.declared: set[str] = set()
        self.connected = False
        self.published: list[tuple[int, str, Message]] = []  # (time, destination, message)
        self.peeks: Counter[str] = Counter()
        self.settles = 0
        self.connects = 0
        self.max_held = 0
        self.fail_connects = 0  # this many next connect() calls fail
        self._fail_settle: tuple[int, bool] | None = None
        self._fail_poll = False
        self.refusals: dict[str, tuple[Reason, str]] = {}  # destination -> why puts fail
        self.counts = 0  # depths() calls
        self.count_waits: list[float | None] = []  # their wait_s
        self.count_failures = 0  # the next depths() calls that raise BrokerUnavailable
        self._held: dict[int, _Holding] = {}
        self._subs: dict[str, int] = {}
        self.listening: set[str] = set()  # topics
        self.refuse_listen: Reason | None = None  # listen raises Refused with this
        self._heard: list[Held] = []
        self.extra_consumers: dict[str, int] = {}  # queue -> consumers on other connections
        self._sub_held: Counter[str] = Counter()
        self._tokens = itertools.count()
        self._seq = itertools.count()
        self._lock = threading.RLock()

    # -- test helpers -----------------------------------------------------------------------

    def put(self, queue: str, message: Message) -> None:
        with self._lock:
            self.queues.setdefault(queue, deque()).append(_Entry(next(self._seq), message))

    def depth(self, queue: str) -> int:
        """Messages on ``queue``, held ones included (the adapters' ``depth``)."""
        with self._lock:
            held = sum(1 for h in self._held.values() if h.held.queue == queue)
            return len(self.queues.get(queue, ())) + held

    def check_put(self, destination: str) -> PutCheck:
        """What ``refusals`` says of ``destination``: no probe of its own."""
        refused = self.refusals.get(destination)
        return PutCheck(Refused(*refused) if refused else None)

    def staging_checks(self, destination: str) -> bool:
        return destination not in self.refusals

    def consumers(self, queue: str) -> int:
        """The engine's subscription, and ``extra_consumers``."""
        with self._lock:
            return (queue in self._subs) + self.extra_consumers.get(queue, 0)

    def depths(
        self, queues: Sequence[str], *, wait_s: float | None = None
    ) -> dict[str, int]:
        with self._lock:
            self.counts += 1
            self.count_waits.append(wait_s)
            if self.count_failures:
                self.count_failures -= 1
                raise BrokerUnavailable("memory broker: no answer to the count")
            return {queue: self.depth(queue) for queue in queues}

    def refuse(self, destination: str, reason: Reason, text: str = "refused") -> None:
        """Every put to ``destination`` is refused from now on."""
        self.refusals[destination] = (reason, text)

    @property
    def held_count(self) -> int:
        return len(self._held)

    def delivered(self, destination: str) -> list[tuple[int, Message]]:
        """What was published to ``destination``: (time, message)."""
        with self._lock:
            return [(t, m) for t, d, m in self.published if d == destination]

    def fail_next_settle(self, after: int, *, published: bool = True) -> None:
        """The next settle does ``after`` moves, then loses the connection; with ``published``
        the move after those is published and confirmed but not acked (a duplicate)."""
        self._fail_settle = (after, published)

    def fail_next_poll(self) -> None:
        self._fail_poll = True

    # -- StagingBroker ----------------------------------------------------------------------

    def connect(self) -> None:
        with self._lock:
            self.connects += 1
            if self.fail_connects:
                self.fail_connects -= 1
                raise BrokerUnavailable("memory broker: connection refused")
            self.connected = True

    def close(self) -> None:
        with self._lock:
            self._lose()

    def ensure_queues(self, names: Sequence[str]) -> None:
        with self._lock:
            self._check()
            for name in names:
                self.declared.add(name)
                self.queues.setdefault(name, deque())

    def peek(self, queue: str) -> Held | None:
        with self._lock:
            self._check()
            self.peeks[queue] += 1
            if self.name == "activemq":
                for holding in self._held.values():
                    if holding.held.queue == queue and not holding.subscribed:
                        return holding.held
            entries = self.queues.get(queue)
            if not entries:
                return None
            return self._hold(queue, entries.popleft(), subscribed=False)

    def put_back(self, held: Held) -> None:
        with self._lock:
            self._check()
            holding = self._held.pop(self._token(held))
            self._give_back(holding)

    def subscribe(self, queue: str, prefetch: int) -> None:
        with self._lock:
            self._check()
            self._subs[queue] = prefetch

    def listen(self, topic: str) -> None:
        with self._lock:
            self._check()
            if self.refuse_listen is not None:
                raise Refused(self.refuse_listen, f"subscribing to /topic/{topic}")
            self.listening.add(topic)

    def watch_expiries(self, queue: str) -> str | None:
        """Messages never expire here: nothing to watch."""
        return None

    def expiry_of(self, message: Message) -> BrokerExpiry | None:
        return None

    def poll(self, timeout: float) -> list[Held]:
        with self._lock:
            self._check()
            if self._fail_poll:
                self._fail_poll = False
                self._lose()
                raise BrokerUnavailable("memory broker: connection reset during poll")
            out, self._heard = self._heard, []
            for queue, prefetch in self._subs.items():
                entries = self.queues.get(queue)
                while entries and self._sub_held[queue] < prefetch:
                    out.append(self._hold(queue, entries.popleft(), subscribed=True))
        if not out and timeout > 0:
            # A tool waiting for the engines' answers polls until its deadline: a short sleep
            # keeps that from spinning a core the rest of the suite needs.
            time.sleep(min(timeout, 0.005 if self.realtime else 0.001))
        return out

    def settle(self, moves: Sequence[Move]) -> None:
        with self._lock:
            self._check()
            self.settles += 1
            fail, self._fail_settle = self._fail_settle, None
            refused: PutRefused | None = None
            also_done: list[int] = []
            for i, move in enumerate(moves):
                if fail is not None and i == fail[0]:
                    if fail[1] and move.destination is not None:
                        self._publish(move)
                    self._lose()
                    raise BrokerUnavailable("memory broker: connection reset during settle")
                if move.destination in self.refusals:
                    if refused is None:
                        reason, text = self.refusals[move.destination]
                        refused = PutRefused(i, reason, text, move.destination)
                    if self.name == "rabbitmq":  # one transaction: the rest is not done
                        raise refused
                    continue  # ActiveMQ: each put on its own, the others go through
                if move.destination is not None:
                    self._publish(move)
                holding = self._held.pop(self._token(move.held))
                if holding.subscribed:
                    self._sub_held[holding.held.queue] -= 1
                if refused is not None:
                    also_done.append(i)
            if refused is not None:
                refused.also_done = tuple(also_done)
                raise refused

    def publish(self, destination: str, message: Message, *, mandatory: bool = False) -> None:
        with self._lock:
            self._check()
            if destination in self.refusals:
                reason, text = self.refusals[destination]
                raise PutRefused(0, reason, text, destination)
            self._publish(Move(Held("", message, None), destination, message))

    def browse(self, queue: str) -> Iterator[Message]:
        with self._lock:
            return iter([e.message for e in self.queues.get(queue, ())])

    def take(
        self, queue: str, header: str, value: str, then: Callable[[Message], None] | None = None
    ) -> Message | None:
        with self._lock:
            entries = self.queues.get(queue, deque())
            for entry in entries:
                if entry.message.headers.get(header) == value:
                    if then is not None:
                        then(entry.message)
                    entries.remove(entry)
                    return entry.message
            return None

    # -- internals --------------------------------------------------------------------------

    def _check(self) -> None:
        if not self.connected:
            raise BrokerUnavailable("memory broker: not connected")

    def _token(self, held: Held) -> int:
        token = held.token
        assert isinstance(token, int) and token in self._held, f"not held: {held!r}"
        return token

    def _hold(self, queue: str, entry: _Entry, *, subscribed: bool) -> Held:
        held = Held(queue, entry.message, next(self._tokens))
        self._held[held.token] = _Holding(entry, held, subscribed)  # type: ignore[index]
        if subscribed:
            self._sub_held[queue] += 1
        self.max_held = max(self.max_held, len(self._held))
        return held

    def _give_back(self, holding: _Holding) -> None:
        if holding.subscribed:
            self._sub_held[holding.held.queue] -= 1
        entries = self.queues.setdefault(holding.held.queue, deque())
        i = 0
        while i < len(entries) and entries[i].seq < holding.entry.seq:
            i += 1
        entries.insert(i, holding.entry)

    def _lose(self) -> None:
        """The connection is gone: the broker gets back everything it had handed out."""
        for holding in sorted(self._held.values(), key=lambda h: -h.entry.seq):
            self._give_back(holding)
        self._held.clear()
        self._sub_held.clear()
        self._subs.clear()
        self.listening.clear()
        self._heard.clear()
        self.connected = False

    def _publish(self, move: Move) -> None:
        destination, message = move.destination, move.message
        assert destination is not None and message is not None
        self.published.append((self.clock(), destination, message))
        if destination.startswith("/topic/"):  # only to those listening now
            topic = destination[len("/topic/"):]
            if topic in self.listening:
                self._heard.append(Held(topic, Message(dict(message.headers), message.body), None))
            return
        for prefix in ("/amq/queue/", "/queue/"):
            if destination.startswith(prefix):
                self.put(destination[len(prefix):], Message(dict(message.headers), message.body))
                return
        self.put(destination, Message(dict(message.headers), message.body))
