"""The event journal: every outcome of a message's life as one JSON line, in rotating files.

``JournalSink`` is one more outcome sink (``bridge.staging.outcomes``): the delay and redelivery
interceptors hand it theirs in the bridge's process, the staging engine its own in the engine's
process. Each process has its own ``JournalWriter`` and its own files, so no two writers ever
share a file.

Writing never blocks traffic: the sink only puts the batch of outcomes on a bounded queue; a
writer thread turns them into JSON lines. A batch that finds the queue full, or that the disk
refuses, is dropped and counted (``jms_bridge_journal_dropped_total``).

A file is written as ``NAME.jsonl.tmp`` and renamed to ``NAME.jsonl`` once closed (after an
fsync), when it reaches ``max_bytes`` or ``max_age_s``, or when the process stops: a reader
that takes only ``*.jsonl`` never sees half a file. ``NAME`` is
``<host>-<pid>-<role>-<opened ms>-<seq>``.
A process killed outright leaves its ``.tmp``; the next writer on the same host finishes it (cut
at its last whole line, then renamed) once no live process has that pid.

The schema is ``journal.schema.json`` beside this module (``SCHEMA_VERSION``). ``hopped`` is
not journaled: a move between two staging levels is the engine's own business, not an event of
the message's life (it is counted in ``jms_bridge_staging_hops_total``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.sharedctypes
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, MutableSequence, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from prometheus_client import CollectorRegistry

from adapters.base import Message
from bridge.app.config import Settings
from bridge.app.metrics import WriterCollector
from bridge.staging.envelope import Staged
from bridge.staging.outcomes import UNJOURNALED, CountedWriter, Kind, MessageOutcome
from policies.errors import ConfigError

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("journal.schema.json")
MAX_BYTES = 64 * 1024 * 1024
MAX_AGE_S = 300.0
QUEUE_BATCHES = 4096  # each batch is one sink call: up to the engine's batch of outcomes
SUFFIX, TMP_SUFFIX = ".jsonl", ".jsonl.tmp"

# Outcomes whose lateness (time minus due time) means something.
_LATENESS = frozenset({Kind.RELEASED, Kind.RELEASED_NOW, Kind.EXPIRED, Kind.UNDELIVERABLE})
_FAILURES = frozenset({Kind.REDELIVERED, Kind.DEAD_LETTERED, Kind.UNDELIVERED, Kind.DELETED})
_NAME = re.compile(r"(?P<host>.+)-(?P<pid>\d+)-(?P<role>[a-z]+)-(?P<opened>\d+)-(?P<seq>\d+)")


def new_counters() -> MutableSequence[int]:
    """Events written, dropped at the queue, dropped by the disk: one writer each (the writer
    thread, the sink's caller, the writer thread), in shared memory, so that the engine process
    writes them and the bridge's ``/metrics`` reads them."""
    counters: MutableSequence[int] = multiprocessing.sharedctypes.RawArray("q", 3)
    return counters


@dataclass(frozen=True, slots=True)
class JournalSpec:
    """What a process needs to open its journal (picklable: handed to the engine process)."""

    directory: str
    instance: str  # the bridge's id: the same in the bridge's and its engine's events
    broker: str
    max_bytes: int = MAX_BYTES
    max_age_s: float = MAX_AGE_S


def instance_id() -> str:
    """This bridge's id in its journal: host name and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


def record(o: MessageOutcome, *, broker: str, instance: str, role: str) -> dict[str, Any]:
    """The journal line of one outcome (absent fields are left out, not null)."""
    kind = o.kind
    line: dict[str, Any] = {"v": SCHEMA_VERSION, "time": o.at_ms, "event": kind.value,
                            "broker": broker, "instance": instance, "process": role}
    if o.message_id is not None:
        line["message_id"] = o.message_id
    if o.target is not None:
        line["destination"] = o.target
    if o.size is not None:
        line["size"] = o.size
    if kind in _FAILURES:
        line["delivery_count"] = o.count
        if kind is Kind.REDELIVERED and o.due_ms is not None:
            line["delay_ms"] = o.due_ms - o.at_ms
    elif o.due_ms is not None:
        line["due"] = o.due_ms
        if kind in _LATENESS:
            line["late_ms"] = o.at_ms - o.due_ms
    if o.expires_ms is not None:
        line["expires"] = o.expires_ms
    if o.reason is not None:
        line["reason"], line["reason_code"] = o.reason.name, o.reason.code
    if o.detail:
        line["detail"] = o.detail
    if o.queue is not None:
        line["queue"] = o.queue
    return line


_STOP = object()


class JournalWriter(CountedWriter):
    """One process's journal files, written by a thread of their own."""

    def __init__(
        self,
        spec: JournalSpec,
        role: str,
        *,
        counters: MutableSequence[int] | None = None,
        queue_batches: int = QUEUE_BATCHES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.role = role
        self.directory = Path(spec.directory)
        self.counters = counters if counters is not None else [0, 0, 0]
        self.clock = clock
        self._queue: queue.Queue[object] = queue.Queue(maxsize=queue_batches)
        self._host = re.sub(r"[^A-Za-z0-9._]", "_", socket.gethostname())
        self._seq = 0
        self._file: IO[str] | None = None
        self._tmp: Path | None = None
        self._opened = 0.0
        self._size = 0
        self._thread: threading.Thread | None = None

    def start(self) -> JournalWriter:
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):
            finish_orphans(self.directory, self._host)
        self._thread = threading.Thread(target=self._run, name=f"journal-{self.role}",
                                        daemon=True)
        self._thread.start()
        return self

    def submit(self, outcomes: Sequence[MessageOutcome]) -> None:
        """Queue a batch for writing, or count it dropped; never waits."""
        try:
            self._queue.put_nowait(outcomes)
        except queue.Full:
            self.counters[1] += len(outcomes)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, close the file (it appears under its final name), stop."""
        thread = self._thread
        if thread is None:
            return
        while thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=0.1)
                break
            except queue.Full:
                continue
        thread.join(timeout)
        self._thread = None

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        q = self._queue
        while True:
            timeout = None
            if self._file is not None:
                timeout = max(0.0, self._opened + self.spec.max_age_s - self.clock())
            try:
                item = q.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                self._close_file()
                return
            if item is not None:
                self._write(item)  # type: ignore[arg-type]
            if self._file is not None and (
                self._size >= self.spec.max_bytes
                or self.clock() - self._opened >= self.spec.max_age_s
            ):
                self._close_file()

    def _write(self, outcomes: Sequence[MessageOutcome]) -> None:
        spec, role = self.spec, self.role
        try:
            text = "".join(
                json.dumps(record(o, broker=spec.broker, instance=spec.instance, role=role),
                           separators=(",", ":"), ensure_ascii=False) + "\n"
                for o in outcomes
            )
            if self._file is None:
                self._open_file()
            assert self._file is not None
            self._file.write(text)
        except (OSError, ValueError, TypeError):
            self.counters[2] += len(outcomes)
            self._abandon_file()
            return
        self._size += len(text.encode())
        self.counters[0] += len(outcomes)

    def _open_file(self) -> None:
        self._opened = self.clock()
        self._seq += 1
        opened_ms = round(self._opened * 1000)
        name = f"{self._host}-{os.getpid()}-{self.role}-{opened_ms}-{self._seq:05d}"
        self._tmp = self.directory / (name + TMP_SUFFIX)
        self._file = open(self._tmp, "x", encoding="utf-8")  # noqa: SIM115 -- kept open
        self._size = 0

    def _close_file(self) -> None:
        f, tmp = self._file, self._tmp
        if f is None or tmp is None:
            return
        self._file = self._tmp = None
        try:
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(tmp, tmp.with_name(tmp.name[: -len(TMP_SUFFIX)] + SUFFIX))
            _fsync_dir(self.directory)
        except OSError:
            # What it held is lost with it: a file that may be cut short never gets the name.
            lost = self._lines_in(tmp)
            self.counters[2] += lost
            self.counters[0] -= lost
            with contextlib.suppress(OSError):
                f.close()

    def _abandon_file(self) -> None:
        """After a write error: what the file held so far is complete lines or not; keep it
        out of sight under ``.tmp`` (counted as dropped) and start a new file next time."""
        f, tmp = self._file, self._tmp
        self._file = self._tmp = None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        if tmp is not None:
            lost = self._lines_in(tmp)
            self.counters[2] += lost
            self.counters[0] -= lost
            with contextlib.suppress(OSError):
                tmp.unlink()

    @staticmethod
    def _lines_in(path: Path) -> int:
        try:
            with open(path, "rb") as f:
                return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
        except OSError:
            return 0


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def finish_orphans(directory: Path, host: str) -> list[Path]:
    """Rename the ``.tmp`` files that a killed process of this host left, cut at their last
    whole line; those of another host, or of a live pid, are left alone."""
    done: list[Path] = []
    for tmp in sorted(directory.glob("*" + TMP_SUFFIX)):
        m = _NAME.fullmatch(tmp.name[: -len(TMP_SUFFIX)])
        if m is None or m["host"] != host or _alive(int(m["pid"])):
            continue
        with open(tmp, "r+b") as f:
            data = f.read()
            f.truncate(data.rfind(b"\n") + 1)
            f.flush()
            os.fsync(f.fileno())
        final = tmp.with_name(tmp.name[: -len(TMP_SUFFIX)] + SUFFIX)
        os.replace(tmp, final)
        done.append(final)
    return done


class JournalSink:
    """The outcome sink that journals: quick, never raises, never waits."""

    def __init__(self, writer: JournalWriter) -> None:
        self.writer = writer

    def __call__(self, outcomes: Sequence[MessageOutcome]) -> None:
        batch = tuple(o for o in outcomes if o.kind not in UNJOURNALED)
        if batch:
            self.writer.submit(batch)


def register(registry: CollectorRegistry, *counters: MutableSequence[int]) -> None:
    """``jms_bridge_journal_written_total`` and ``..._dropped_total``, summed over the
    processes' counters (the bridge's and its engine's)."""
    registry.register(WriterCollector(
        "jms_bridge_journal", "Events written to the journal.",
        "Journal events dropped: the writer's queue was full or the disk refused them.",
        *counters))


class Journal:
    """The bridge process's journal and what its engine process needs for its own."""

    def __init__(self, spec: JournalSpec, registry: CollectorRegistry) -> None:
        self.spec = spec
        self.engine_counters = new_counters()
        try:
            self.writer = JournalWriter(spec, "bridge", counters=new_counters()).start()
        except OSError as exc:
            raise ConfigError(f"journal: cannot write to {spec.directory}: "
                              f"{exc.strerror or exc}") from None
        register(registry, self.writer.counters, self.engine_counters)

    @classmethod
    def open(cls, settings: Settings, registry: CollectorRegistry) -> Journal | None:
        """The journal ``settings`` ask for, or None when it is off."""
        if settings.journal is None:
            return None
        return cls(JournalSpec(settings.journal, instance_id(), settings.broker), registry)

    @property
    def sinks(self) -> list[JournalSink]:
        return [JournalSink(self.writer)]

    def close(self) -> None:
        self.writer.close()


def journal_tool(settings: Settings, kind: Kind, staged: Message, *,
                 due_ms: int | None = None) -> None:
    """The event of a staged message an operator's tool cancelled, released or rescheduled
    (to ``due_ms``) itself while no staging engine ran (otherwise an engine journals it: the
    one that held it, or the one that took the tool's note), in the tool's own journal file."""
    if settings.journal is None:
        return
    try:
        info = Staged.of(staged.headers)
    except (KeyError, ValueError):
        return
    now = time.time_ns() // 1_000_000
    writer = JournalWriter(JournalSpec(settings.journal, instance_id(), settings.broker),
                           "tool").start()
    try:
        detail = f"was due at {info.due_ms}" if due_ms is not None else ""
        JournalSink(writer)([MessageOutcome(kind, now, info.message_id, info.target,
                                            due_ms if due_ms is not None else info.due_ms,
                                            info.expires_ms, size=len(staged.body), detail=detail)])
    finally:
        writer.close()
