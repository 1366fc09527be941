"""``jms-bridge dlq list|count|browse|purge|replay|move``: the operations, over the
``adapters.queues.QueueTools`` port, for the CLI and the admin API alike.

A selector (JMS SQL-92, ``policies.selector``) picks the messages; without one every message
of the queue is picked. JMSDestination reads a dead letter's original destination, TIBCO's way
(``JMSDestination='Queue[orders]'``). ``--limit N`` stops after N picked messages.

- ``replay`` puts each picked message back to its original destination (or ``to``) as the
  application sent it (``metadata.replay_headers``), marked ``jms-bridge-replay-of: <original
  id>``, and removes it from the queue in the same broker transaction as the put: killed at
  any moment, a rerun replays what was not replayed and nothing twice. A picked message whose
  original destination is unknown (and no ``to``) stays, counted as skipped.
- ``move`` puts each picked message to ``to`` unchanged: its dead-letter metadata stays on it
  (a move between dead-letter queues, to park or hand over); only the per-delivery headers go.
- ``purge`` removes what is picked.

Each decision is logged once, with the message's original id, after the broker committed it.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import structlog

from adapters.base import Message, StagedFormat
from adapters.queues import DROP, KEEP, Found, Put, QueueTools, SweepAction, SweepReport, Visit
from bridge.deadletter import metadata
from bridge.deadletter.deadletter_stats import DeadLetterStats
from policies.errors import BrokerUnavailable, ConfigError, PutRefused
from policies.selector import HeaderMap, Selector, compile_selector

log = structlog.get_logger("deadletter")


@dataclass(frozen=True, slots=True)
class Picker:
    """Which messages an operation takes: a compiled selector, or all."""

    selector: Selector | None

    @classmethod
    def of(cls, text: str | None, base: HeaderMap) -> Picker:
        if text is None or not text.strip():
            return cls(None)
        return cls(compile_selector(text, metadata.selector_headers(base)))

    def __call__(self, headers: dict[str, str]) -> bool:
        return self.selector is None or self.selector.matches(headers)


@dataclass(frozen=True, slots=True)
class Entry:
    """One message as ``dlq browse`` shows it."""

    position: int
    broker_id: str
    info: metadata.Info
    headers: dict[str, str]
    body: bytes

    def as_dict(self, *, body: bool) -> dict[str, object]:
        out: dict[str, object] = {"position": self.position, "broker_id": self.broker_id,
                                  **self.info.as_dict(), "size": len(self.body)}
        out["failed_at"] = _iso(self.info.failed_at_ms)
        out["headers"] = self.headers
        if body:
            out["body"] = self.body.decode("utf-8", "replace")
        return out


@dataclass(slots=True)
class QueueOperationOutcome:
    """What an operation that changes a queue did."""

    operation: str
    queue: str
    seen: int = 0
    picked: int = 0
    done: int = 0  # purged, replayed or moved (committed)
    skipped: int = 0  # picked but left: no original destination to replay to
    by_destination: dict[str, int] = field(default_factory=dict)
    error: str | None = None  # why it stopped before the end (what was done stays done)
    interrupted: bool = False  # stopped on request (``stop``) before the end

    def as_dict(self) -> dict[str, object]:
        return {"operation": self.operation, "queue": self.queue, "seen": self.seen,
                "picked": self.picked, "done": self.done, "skipped": self.skipped,
                "by_destination": self.by_destination, "error": self.error}

    def describe(self) -> str:
        verb = _PAST[self.operation]
        text = f"{verb} {self.done} of {self.seen} messages on {self.queue}"
        if self.skipped:
            text += f"; {self.skipped} left (no original destination: use --to)"
        return text


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class Listing:
    """The dead-letter queues found, with their message counts. ``incomplete`` says why the
    broker's own list of queues is missing (only the queues known by name are there)."""

    queues: dict[str, int]
    incomplete: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"queues": [{"queue": q, "messages": n} for q, n in self.queues.items()],
                "incomplete": self.incomplete}


def candidates(tools: QueueTools, *, prefix: str, named: Sequence[str] = ()) -> Listing:
    """The dead-letter queues the broker has (the names ``metadata.is_candidate`` takes, and
    ``named``), with their message counts."""
    found: dict[str, int] = {}
    incomplete = None
    listed: dict[str, int | None]
    try:
        listed = dict(tools.queue_sizes(metadata.CANDIDATE_NAMES))
    except BrokerUnavailable as exc:  # the broker cannot list: the names the bridge knows
        incomplete = f"the broker did not list its queues: {exc}"
        listed = dict.fromkeys([metadata.UNDELIVERED, f"{prefix}.undeliverable", "ActiveMQ.DLQ"])
    for name in sorted(listed):
        if metadata.is_candidate(name):
            size = _count(tools, name, listed[name])
            if size is not None:
                found[name] = size
    for name in named:
        found[name] = _count(tools, name, listed.get(name)) or 0
    return Listing(found, incomplete)


def _count(tools: QueueTools, queue: str, listed: int | None) -> int | None:
    """The broker's own count now (RabbitMQ's management API lags by seconds); the listed one
    for a queue only its owner may look at (another connection's exclusive queue)."""
    try:
        return tools.size(queue)
    except PutRefused:
        return listed


def browse(tools: QueueTools, queue: str, picker: Picker, *, limit: int | None,
           on_seen: Callable[[], None] | None = None,
           stop: Callable[[], bool] | None = None) -> Iterator[Entry]:
    """The messages ``picker`` takes, head first, none removed; ``on_seen`` is called for each
    message looked at, and ``stop`` returning True ends the browse before the next one."""
    taken = 0
    pages = tools.inspect(queue)
    try:
        for found in pages:
            if limit is not None and taken >= limit:
                return
            if on_seen is not None:
                on_seen()
            if stop is not None and stop():
                return
            headers = found.message.headers
            if not picker(headers):
                continue
            taken += 1
            yield Entry(found.position, found.broker_id,
                        metadata.describe(headers, found.broker_id), dict(headers),
                        found.message.body)
    finally:
        close = getattr(pages, "close", None)
        if close is not None:
            close()


def count(tools: QueueTools, queue: str, picker: Picker) -> int:
    if picker.selector is None:
        return tools.size(queue) or 0
    return sum(1 for _ in browse(tools, queue, picker, limit=None))


def change(
    tools: QueueTools,
    operation: str,
    queue: str,
    picker: Picker,
    fmt: StagedFormat,
    *,
    limit: int | None = None,
    to: str | None = None,
    stats: DeadLetterStats | None = None,
    batch: int = 500,
    before_commit: Callable[[Sequence[Visit]], None] | None = None,
    label: str | None = None,
    on_seen: Callable[[], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> QueueOperationOutcome:
    """purge, replay or move: one sweep of ``queue``. A refused put or a lost broker stops
    it: what was committed before stays done, the rest stays on the queue, and the outcome
    says why it stopped (``error``). ``label`` names the operation in logs and counters.
    ``on_seen`` is called for each message looked at; ``stop`` is asked before each commit,
    and True ends the sweep there with that batch undone (``interrupted``)."""
    if operation == "move" and not to:
        raise ConfigError("dlq move needs --to DEST (where the messages go, metadata and all)")
    if operation not in ("purge", "replay", "move"):
        raise ConfigError(f"unknown operation {operation!r}")
    outcome = QueueOperationOutcome(label or operation, queue)
    infos: dict[int, metadata.Info] = {}
    started = time.monotonic()

    def decide(found: Found) -> SweepAction:
        if on_seen is not None:
            on_seen()
        headers = found.message.headers
        if not picker(headers):
            return KEEP
        outcome.picked += 1
        info = metadata.describe(headers, found.broker_id)
        if operation == "purge":
            infos[found.position] = info
            return DROP
        if operation == "move":
            assert to is not None
            infos[found.position] = info
            return Put(to, Message(metadata.moved_headers(headers, info), found.message.body))
        where = to or info.original_destination
        if not where:
            outcome.skipped += 1
            log.warning("not replayed: no original destination", queue=queue,
                        original_id=info.original_id)
            return KEEP
        infos[found.position] = info
        return Put(where, Message(metadata.replay_headers(headers, info, fmt),
                                  found.message.body))

    def committed(visits: Sequence[Visit]) -> None:
        for visit in visits:
            info = infos.pop(visit.found.position)
            where = visit.action.destination if isinstance(visit.action, Put) else None
            outcome.done += 1
            if where is not None:
                outcome.by_destination[where] = outcome.by_destination.get(where, 0) + 1
            if stats is not None:
                stats.count(outcome.operation, info.reason or "none")
            log.info(_PAST[outcome.operation], queue=queue, original_id=info.original_id,
                     reason=info.reason, to=where)

    def checked(visits: Sequence[Visit]) -> None:
        if stop is not None and stop():
            raise _Stopped
        if before_commit is not None:
            before_commit(visits)

    try:
        report: SweepReport = tools.sweep(queue, decide, limit=limit, batch=batch,
                                          before_commit=checked, after_commit=committed)
        outcome.seen = report.seen
    except _Stopped:
        outcome.interrupted = True
        log.info("stopped on request", operation=outcome.operation, queue=queue,
                 done=outcome.done)
        return outcome
    except PutRefused as refused:
        outcome.error = f"{operation} stopped: {refused}"
        log.error("stopped", operation=outcome.operation, queue=queue, error=str(refused))
        return outcome
    except (BrokerUnavailable, ConfigError) as error:
        outcome.error = f"{operation} stopped: {error}"
        log.error("stopped", operation=outcome.operation, queue=queue, error=str(error))
        return outcome
    log.debug("sweep done", operation=operation, queue=queue, seen=report.seen,
              done=outcome.done, seconds=round(time.monotonic() - started, 3))
    return outcome


class _Stopped(Exception):
    """Raised before a commit to end a sweep on request, that batch undone."""


_PAST = {"purge": "purged", "replay": "replayed", "move": "moved", "export": "exported"}


def render_list(listing: Listing, *, as_json: bool) -> str:
    if as_json:
        return json.dumps(listing.as_dict(), indent=2)
    queues = listing.queues
    if queues:
        width = max(32, *(len(q) for q in queues))
        lines = [f"{'QUEUE':<{width}} {'MESSAGES':>10}"]
        lines += [f"{q:<{width}} {n:>10}" for q, n in queues.items()]
    else:
        lines = ["no dead-letter queues"]
    if listing.incomplete is not None:
        lines.append(f"INCOMPLETE: only the queues known by name are shown; "
                     f"{listing.incomplete}")
    return "\n".join(lines)


def render_entries(entries: list[Entry], *, as_json: bool, body: bool) -> str:
    if as_json:
        return json.dumps([e.as_dict(body=body) for e in entries], indent=2)
    if not entries:
        return "no messages"
    lines = [f"{'#':>6} {'ORIGINAL ID':<44} {'REASON':<32} {'ORIGINAL DESTINATION':<28} "
             f"{'FAILED AT (UTC)':<29} {'DELIVERIES':>10}"]
    for e in entries:
        i = e.info
        lines.append(
            f"{e.position:>6} {i.original_id:<44} {(i.reason or '-'):<32} "
            f"{(i.original_destination or '-'):<28} {(_iso(i.failed_at_ms) or '-'):<29} "
            f"{i.delivery_count if i.delivery_count is not None else '-':>10}")
        if body:
            lines.append("       " + e.body.decode("utf-8", "replace")[:2000])
    return "\n".join(lines)
