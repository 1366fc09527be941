"""A Spark job seen from the driver: its tasks' progress, polled, and Ctrl-C.

PySpark's own SIGINT handler calls the JVM from inside the call it interrupts: Py4J's
connection breaks, its tracebacks go to the root logger and the job ends as a failure. While a
``Watch`` is open, Ctrl-C only sets a flag; its thread (another Py4J connection) cancels the
jobs, and the job's caller raises ``Interrupted`` with one line saying what was done. A second
Ctrl-C raises KeyboardInterrupt at once.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Protocol

POLL_S = 0.5


class Meter(Protocol):
    """Where the tasks' progress goes (the command's progress bar)."""

    def reach(self, done: int, total: int | None) -> None: ...

    def close(self) -> None: ...


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped the job; ``line`` says what was done."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class Watch:
    """While open: a thread polls the status tracker (tasks done of the stages seen) into the
    meter ``meter()`` makes, and Ctrl-C cancels the jobs (``asked`` then holds)."""

    def __init__(self, spark: Any, meter: Callable[[], Meter] | None = None,
                 interval: float = POLL_S) -> None:
        self._sc = spark.sparkContext
        self._make = meter
        self._meter: Meter | None = None
        self._interval = interval
        self._asked = threading.Event()
        self._done = threading.Event()
        self._wake = threading.Event()
        self._stages: dict[int, tuple[int, int]] = {}  # stage id: (tasks done, tasks)
        self._finished: set[int] = set()
        self._thread = threading.Thread(target=self._poll, name="spark-watch", daemon=True)
        self._previous: Any = None

    @property
    def asked(self) -> bool:
        return self._asked.is_set()

    def __enter__(self) -> Watch:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._ask)
        self._meter = self._make() if self._make is not None else None
        self._thread.start()
        return self

    def __exit__(self, _t: type[BaseException] | None, _e: BaseException | None,
                 _tb: TracebackType | None) -> None:
        self._done.set()
        self._wake.set()
        self._thread.join(timeout=5)
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        if self._meter is not None:
            self._meter.close()

    def _ask(self, _signum: int, _frame: FrameType | None) -> None:
        self._asked.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        quiet()
        self._wake.set()  # the thread cancels now

    def _poll(self) -> None:
        while not self._done.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                if self._asked.is_set():  # each time: a job started since is cancelled too
                    self._sc.cancelAllJobs()
                elif self._meter is not None:
                    self._meter.reach(*self._tasks())
            except Exception:  # noqa: BLE001 - Spark stopping under the thread: nothing to show
                return

    def _tasks(self) -> tuple[int, int]:
        tracker = self._sc.statusTracker()
        active = set(tracker.getActiveStageIds())
        for sid in active | (set(self._stages) - self._finished):
            info = tracker.getStageInfo(sid)
            if sid not in active:  # ended since the last poll
                self._finished.add(sid)
                if info is None:
                    self._stages[sid] = (self._stages[sid][1],) * 2
                    continue
            if info is not None:
                self._stages[sid] = (info.numCompletedTasks, info.numTasks)
        done = sum(d for d, _ in self._stages.values())
        return done, sum(n for _, n in self._stages.values())


def quiet() -> None:
    """Py4J's errors while Spark stops under a cancelled job are not the user's to read."""
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    logging.getLogger().setLevel(logging.CRITICAL)
