"""The staged catalogue: an index of the messages a bridge has staged, by original id and by
target, in a SQLite file of the bridge's own (``--staged-catalogue FILE``).

The staging queues are the truth, but they can only be read from the front: with ten million
pending, ``staged list --target`` and ``cancel`` read them all (slowly: docs/benchmarks.md). IBM
MQ indexes its staging queue by correlation id for the same reason. The catalogue answers those
questions in milliseconds; the running engines answer the tools from it (``bridge.staging.
orders``: a LIST order asks for it), so every bridge sharing a broker answers for what it staged.

It is fed by the outcomes both processes of a bridge already produce (a ``Sink``): the bridge's
STAGED (and REDELIVERED with a delay) add a row; the engine's releases, cancels, expiries and
failures take it out. Rows are never trusted past their due
time: a message is released by whichever bridge's engine meets it, and only that bridge's
catalogue hears of it. So the catalogue shows the messages not yet due; the engines' own
answers show what they hold, and ``--scan`` (reading the queues) the rest: a message past its
due time and not yet released (no engine running), one staged by a bridge without a catalogue.
Rows a day past due are purged.

Writing never blocks the caller: changes wait in memory and a writer thread commits all that
has come in one transaction; past ``MAX_PENDING`` rows waiting they are dropped and counted (the
message is still staged: it is only missing from the catalogue, and ``staged list --scan``
still finds it). A row is offered before its send is confirmed but committed later (up to
SQLite's busy wait later), so an engine answering from the catalogue first waits until both
processes' writers have committed what was offered before the order (``Catalogue.caught_up``,
over the writers' counters in shared memory), or answers without the catalogue.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing.sharedctypes
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import structlog

from bridge.staging.outcomes import CountedWriter, Kind, MessageOutcome
from bridge.staging.selection import narrowing, picks_json, props_json
from policies.errors import ConfigError
from policies.selector import Selector

MAX_PENDING = 200_000  # rows waiting for the writer (about 30 MB); more are dropped
PURGE_EVERY_S = 600.0  # a scan of every row (107 ms at 3,000,000, in-process)
PURGE_AFTER_MS = 86_400_000  # rows this long past due are gone from every answer anyway
MAX_ROWS = 10_000  # rows in one answer
# How long a catalogue answer waits for the writers to commit the rows offered before its order
# (within the tools' 2 s wait for answers); past it, the engine answers without the catalogue.
FLUSH_WAIT_S = 1.0
BUSY_MS = 5_000  # the bridge's and the engine's writers share the file
WARN_EVERY_S = 60.0

OFFERED, SETTLED = 3, 4  # slots of a writer's counters (``new_counters``)

log = structlog.get_logger("staging.catalogue")
T = TypeVar("T")

# Outcomes that take a message off the staging queues for good.
_GONE = frozenset({
    Kind.RELEASED, Kind.RELEASED_NOW, Kind.CANCELLED, Kind.EXPIRED, Kind.UNDELIVERABLE,
    Kind.INVALID, Kind.UNDELIVERED, Kind.DEAD_LETTERED, Kind.DELETED,
})

# A row is about 155 bytes on disk with its two indexes; targets are kept once each. Neither
# index is by due time: rows come in random due order, and an index by it had every batch
# rewrite a page per row (figures: docs/benchmarks.md, "Measurements behind design choices").
# A target's rows are found by the target index and sorted, all rows by a scan.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS targets (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS staged (
    message_id TEXT NOT NULL UNIQUE,
    target INTEGER NOT NULL,
    due_ms INTEGER NOT NULL,
    size INTEGER NOT NULL,
    props TEXT
);
CREATE INDEX IF NOT EXISTS staged_by_target ON staged (target);
CREATE TABLE IF NOT EXISTS orders (
    message_id TEXT PRIMARY KEY,
    action TEXT NOT NULL,
    until_ms INTEGER NOT NULL
) WITHOUT ROWID;
"""


@dataclass(frozen=True, slots=True)
class Entry:
    message_id: str
    target: str
    due_ms: int
    size: int
    # The staged copy's headers, as the outcome brought them (the writer keeps the message's
    # own headers, for selectors); not read back.
    headers: Mapping[str, str] | Sequence[tuple[str, str]] | None = field(
        default=None, compare=False, repr=False)


def new_counters() -> MutableSequence[int]:
    """A writer's counters (``CatalogueWriter.counters``) in shared memory: ``/metrics`` and
    the engine's process read them."""
    counters: MutableSequence[int] = multiprocessing.sharedctypes.RawArray("q", 5)
    return counters


def open_file(path: str) -> sqlite3.Connection:
    """A connection to the catalogue at ``path``, made if missing; ConfigError naming the file
    when SQLite cannot use it."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None,
                             check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA cache_size=-4096")  # 4 MiB: the file is read by its indexes
        db.execute("PRAGMA journal_size_limit=16777216")  # the WAL, once checkpointed
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(staged)")}
        if "props" not in columns:  # a file made before rows kept their headers
            db.execute("ALTER TABLE staged ADD COLUMN props TEXT")
    except (OSError, sqlite3.Error) as error:
        raise ConfigError(f"staged-catalogue {path}: SQLite cannot use it: {error}") from None
    return db


class Catalogue:
    """The engine's side: reads of the catalogue (one connection, used by one thread at a
    time), and the ids an operator's order takes out (through the process's writer)."""

    def __init__(self, path: str, writer: CatalogueWriter | None = None,
                 feeds: Sequence[MutableSequence[int]] = ()) -> None:
        self.path = path
        self.writer = writer
        # The counters of every writer of the file (the bridge's process's come from there).
        self._feeds = [*([writer.counters] if writer is not None else []), *feeds]
        self._db = open_file(path)
        # Reads run here, off the engine's loop: a large target's rows take a while to sort.
        self._reader = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="jms-bridge-catalogue-reader")

    def later(self, read: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``read`` (which may call ``entries``) on the catalogue's reader thread."""
        return self._reader.submit(read)

    def offered(self) -> list[int]:
        """How many changes each writer of the file has been offered so far."""
        return [int(c[OFFERED]) for c in self._feeds]

    def caught_up(self, offered: Sequence[int], wait_s: float | None = None) -> bool:
        """Whether every writer has committed (or given up on) the changes ``offered``
        counted, waiting up to ``wait_s`` (``FLUSH_WAIT_S``) on the reader thread: another
        process's writer is only seen through its counters."""
        deadline = time.monotonic() + (FLUSH_WAIT_S if wait_s is None else wait_s)
        while any(int(c[SETTLED]) < n for c, n in zip(self._feeds, offered, strict=True)):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True

    def forget(self, message_ids: Sequence[str]) -> None:
        if self.writer is not None:
            self.writer.forget(message_ids)

    def remember(self, message_id: str, action: str, until_ms: int) -> None:
        """An operator's order the engine remembers until ``until_ms``: kept here too, so that
        the engine remembers it after a restart."""
        if self.writer is not None:
            self.writer.offer([], [], [(message_id, action, until_ms)])

    def remembered(self, now_ms: int) -> list[tuple[str, str, int]]:
        """The orders that still stand: (message id, action, until ms)."""
        return [(str(m), str(a), int(u)) for m, a, u in self._db.execute(
            "SELECT message_id, action, until_ms FROM orders WHERE until_ms > ? ORDER BY until_ms",
            (now_ms,))]

    def entries(
        self, *, now_ms: int, target: str | None = None, message_id: str | None = None,
        limit: int = MAX_ROWS, selector: Selector | None = None,
    ) -> list[Entry]:
        """The catalogued messages not yet due that ``selector`` selects, soonest first.
        SQLite checks what it can of the selector (``selection.narrowing``); the selector
        itself runs on the rows that pass."""
        sql = ("SELECT s.message_id, t.name, s.due_ms, s.size FROM staged s "
               "JOIN targets t ON t.id = s.target WHERE s.due_ms > ?")
        args: list[object] = [now_ms]
        if selector is not None:
            narrow = narrowing(selector, "s.props")
            if narrow is not None:
                sql += f" AND ({narrow[0]})"
                args += narrow[1]
            self._db.create_function("jbt_selected", 1,
                                     lambda props: picks_json(selector, props))
            sql += " AND jbt_selected(s.props)"
        if message_id is not None:
            sql += " AND s.message_id = ?"
            args.append(message_id)
        if target is not None:
            sql += " AND t.name = ?"
            args.append(target)
        sql += " ORDER BY s.due_ms LIMIT ?"
        args.append(limit)
        return [Entry(*row) for row in self._db.execute(sql, args)]

    def close(self) -> None:
        self._reader.shutdown(wait=True, cancel_futures=True)
        if self.writer is not None:
            self.writer.close()
        with contextlib.suppress(sqlite3.Error):
            self._db.close()


def changes(outcomes: Iterable[MessageOutcome]) -> tuple[list[Entry], list[str]]:
    """The rows ``outcomes`` add (a delayed send, a delayed redelivery) and the ids they take
    out. (A message waiting for its message-retry is past its due time: not shown.)"""
    adds: list[Entry] = []
    gone: list[str] = []
    for o in outcomes:
        if o.message_id is None:
            continue
        kind = o.kind
        if kind is Kind.STAGED or kind is Kind.RESCHEDULED or (
            kind is Kind.REDELIVERED and o.due_ms is not None and o.due_ms > o.at_ms
        ):
            if o.target is not None and o.due_ms is not None:
                adds.append(Entry(o.message_id, o.target, o.due_ms, o.size or 0,
                                  o.headers))
        elif kind in _GONE:
            gone.append(o.message_id)
    return adds, gone


class CatalogueWriter(CountedWriter):
    """The one thread of a process that writes the catalogue; ``CatalogueSink`` feeds it.

    Changes wait in lists under a lock (an append per sink call, however fast they come) and
    the thread writes all that has come in one transaction. Past ``MAX_PENDING`` rows waiting
    (the file much slower than the traffic) new changes are dropped and counted."""

    def __init__(self, path: str, counters: MutableSequence[int] | None = None) -> None:
        self.path = path
        self._db = open_file(path)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._adds: list[Entry] = []
        self._gone: list[str] = []
        self._orders: list[tuple[str, str, int]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="jms-bridge-catalogue",
                                        daemon=True)
        # Rows written (added or taken out, orders kept), rows dropped while too many waited,
        # rows SQLite refused, rows offered, rows settled (written or refused); shared memory
        # (``new_counters``) where another process reads them (``/metrics``, the engine).
        self.counters: MutableSequence[int] = counters if counters is not None else [0] * 5
        # What a writer before this one (an engine process that died) never settled is lost.
        self.counters[SETTLED] = self.counters[OFFERED]
        self._warned_at = 0.0
        self._targets: dict[str, int] = {}  # name -> id, as written

    def start(self) -> CatalogueWriter:
        self._thread.start()
        return self

    def offer(self, adds: list[Entry], gone: list[str],
              orders: list[tuple[str, str, int]] | None = None) -> None:
        with self._lock:
            if len(self._adds) + len(self._gone) >= MAX_PENDING:
                self.counters[1] += len(adds) + len(gone) + len(orders or ())
                return
            self._adds += adds
            self._gone += gone
            if orders:
                self._orders += orders
            self.counters[OFFERED] += len(adds) + len(gone) + len(orders or ())
        self._wake.set()

    def forget(self, message_ids: Sequence[str]) -> None:
        """Take these out (an operator's cancel or release order, which every engine hears)."""
        self.offer([], list(message_ids))

    def close(self, timeout: float = 5.0) -> None:
        """Write what waits, then close the file."""
        with self._lock:
            self._closed = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        with contextlib.suppress(sqlite3.Error):
            self._db.close()

    def _run(self) -> None:
        next_purge = time.monotonic() + PURGE_EVERY_S
        while True:
            self._wake.wait(PURGE_EVERY_S)
            self._wake.clear()
            with self._lock:
                adds, gone, orders = self._adds, self._gone, self._orders
                self._adds, self._gone, self._orders = [], [], []
                closed = self._closed
            if adds or gone or orders:
                self._write(adds, gone, orders)
            if time.monotonic() >= next_purge:
                next_purge = time.monotonic() + PURGE_EVERY_S
                self._purge()
            if closed:
                return

    def _write(self, adds: list[Entry], gone: list[str],
               orders: list[tuple[str, str, int]]) -> None:
        """One transaction: the rows added, then those taken out (a message released soon
        after it was staged: both in one batch), then the orders."""
        db = self._db
        try:
            db.execute("BEGIN")
            if adds:
                db.executemany(
                    "INSERT OR REPLACE INTO staged (message_id, target, due_ms, size, props) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(e.message_id, self._target(e.target), e.due_ms, e.size, _props(e))
                     for e in adds])
            if gone:
                db.executemany("DELETE FROM staged WHERE message_id = ?", [(m,) for m in gone])
            if orders:
                db.executemany("INSERT OR REPLACE INTO orders VALUES (?, ?, ?)", orders)
            db.execute("COMMIT")
            self.counters[0] += len(adds) + len(gone) + len(orders)
            self.counters[SETTLED] += len(adds) + len(gone) + len(orders)
        except sqlite3.Error as error:
            self.counters[2] += len(adds) + len(gone) + len(orders)
            self.counters[SETTLED] += len(adds) + len(gone) + len(orders)
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if time.monotonic() - self._warned_at > WARN_EVERY_S:
                self._warned_at = time.monotonic()
                log.warning("the staged catalogue's file refused a write; those messages are "
                            "still staged, but missing from the catalogue (staged list --scan "
                            "finds them)", file=self.path, error=str(error))

    def _target(self, name: str) -> int:
        """The id of a target's name (either process may have written it first)."""
        known = self._targets.get(name)
        if known is None:
            db = self._db
            db.execute("INSERT OR IGNORE INTO targets (name) VALUES (?)", (name,))
            (known,) = db.execute("SELECT id FROM targets WHERE name = ?", (name,)).fetchone()
            if len(self._targets) >= 100_000:
                self._targets.clear()
            self._targets[name] = known
        return int(known)

    def _purge(self) -> None:
        now_ms = time.time_ns() // 1_000_000
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("DELETE FROM staged WHERE due_ms < ?", (now_ms - PURGE_AFTER_MS,))
            self._db.execute("DELETE FROM orders WHERE until_ms < ?", (now_ms,))


def _props(entry: Entry) -> str | None:
    """The JSON the catalogue keeps of a message's own headers (on the writer's thread: the
    sink only passes the outcome's headers on)."""
    headers = entry.headers
    if headers is None:
        return None
    if not isinstance(headers, dict):
        first: dict[str, str] = {}
        for name, value in (headers.items() if isinstance(headers, Mapping) else headers):
            first.setdefault(name, value)  # the first of a repeated header counts
        headers = first
    return props_json(headers)


class CatalogueSink:
    """The outcome sink that keeps the catalogue (quick, never raises)."""

    def __init__(self, writer: CatalogueWriter) -> None:
        self.writer = writer

    def __call__(self, outcomes: Sequence[MessageOutcome]) -> None:
        adds, gone = changes(outcomes)
        if adds or gone:
            self.writer.offer(adds, gone)
