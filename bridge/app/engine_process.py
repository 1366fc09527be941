"""The staging engine in a process of its own, started and watched by ``jms-bridge run``.

The engine's work (pika frames, header dicts) is CPU-bound Python. In the bridge's process it
takes the interpreter lock from the STOMP front-end, and a SEND that waits for the lock is read
late, so its due time (counted from when the bridge reads it) is late too. In its own process
it runs on another core (figures: docs/benchmarks.md, "Measurements behind design choices").

It shares only its counters (``StagingStats`` slots in shared memory) and a stop event with the
bridge. It dies with the bridge (``PR_SET_PDEATHSIG``), which is the same as the bridge being
killed: every staged message is on the broker, and what the engine held goes back to its queue.
If it dies on its own, the bridge logs why and starts another, waiting longer each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import multiprocessing
import multiprocessing.process
import multiprocessing.synchronize
import os
import signal
import sys
import time
from collections.abc import MutableSequence

from bridge.app import logs
from bridge.app.brokers import staging_broker
from bridge.app.config import Settings
from bridge.app.journal import JournalSink, JournalSpec, JournalWriter
from bridge.staging.catalogue import Catalogue, CatalogueSink, CatalogueWriter
from bridge.staging.engine import Engine
from bridge.staging.failures import FailureSettings
from bridge.staging.levels import Layout
from bridge.staging.outcomes import Sink
from bridge.staging.staging_stats import StagingStats
from policies.backoff import backoff_ms

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# The engine's adapter reads the broker on a thread of its own (stomp.py's receiver, pika's
# none): a RECEIPT it hands over waits for the interpreter lock while that thread parses the
# MESSAGE frames behind it, up to the switch interval (5 ms by default) each time; a shorter one
# keeps releases punctual under load (docs/benchmarks.md, "Measurements behind design choices").
SWITCH_INTERVAL_S = 0.0005
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
WATCH_EVERY_S = 1.0
# The engine's reconnect backoff: from 50 ms, doubling, capped at half a second and spread by
# +-50 %, so that its first release comes within a second of a broker answering again (a longer
# cap would add up to that cap to the lateness of whatever fell due during an outage).
RECONNECT_S = (0.05, 0.5)
RECONNECT_JITTER = 0.5


class EngineProcess:
    """Starts the engine process, restarts it if it dies, stops it on ``close``."""

    def __init__(
        self, settings: Settings, layout: Layout, stats: StagingStats, *,
        journal: tuple[JournalSpec, MutableSequence[int]] | None = None,
        catalogue_counters: MutableSequence[int] | None = None,
        catalogue_feed: MutableSequence[int] | None = None,
    ) -> None:
        self.settings = settings
        self.journal = journal  # the engine's own journal files, and its shared counters
        self.catalogue_counters = catalogue_counters  # its staged catalogue writer's
        self.catalogue_feed = catalogue_feed  # the bridge's process's catalogue writer's
        self.layout = layout
        self.stats = stats  # its slots must be shared memory (``staging_stats.shared_slots()``)
        self._ctx = multiprocessing.get_context("spawn")  # never fork a process with threads
        self.stop = self._ctx.Event()
        self.process: multiprocessing.process.BaseProcess | None = None
        self._started_at = 0.0
        self._log = logs.get("staging")

    def start(self) -> None:
        self.process = self._ctx.Process(
            target=_main,
            args=(self.settings, self.layout, self.stats.slots, self.stop, os.getpid(),
                  self.journal, self.catalogue_counters, self.catalogue_feed),
            name="jms-bridge-staging",
            daemon=True,
        )
        self.process.start()
        self._started_at = time.monotonic()
        self._log.info("staging engine process started", pid=self.process.pid)

    async def watch(self) -> None:
        """Start another engine process whenever it exits without being asked to: after
        RESTART_FIRST_S when the one that died had run a while, and twice as long each time
        one dies again soon (up to RESTART_MAX_S)."""
        deaths = 0
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            if self.stop.is_set():
                return
            process = self.process
            if process is None or process.is_alive():
                continue
            if time.monotonic() - self._started_at > RESTART_MAX_S:
                deaths = 0
            deaths += 1
            wait_s = backoff_ms(deaths, initial_ms=round(RESTART_FIRST_S * 1000),
                                max_ms=round(RESTART_MAX_S * 1000)) / 1000
            self._log.error("staging engine process exited; starting another",
                            exitcode=process.exitcode, retry_in_s=wait_s)
            await asyncio.sleep(wait_s)
            if not self.stop.is_set():
                self.start()

    async def close(self, grace: float = 10.0) -> None:
        """Ask the engine to stop (it gives back what it holds); kill it after ``grace`` s."""
        self.stop.set()
        process = self.process
        if process is None:
            return
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, process.join, grace)
        if process.is_alive():
            self._log.warning("staging engine process did not stop in time; killing it",
                              pid=process.pid, grace_s=grace)
            process.kill()
            await loop.run_in_executor(None, process.join, 5.0)


def _main(
    settings: Settings,
    layout: Layout,
    slots: MutableSequence[int],
    stop: multiprocessing.synchronize.Event,
    parent: int,
    journal: tuple[JournalSpec, MutableSequence[int]] | None = None,
    catalogue_counters: MutableSequence[int] | None = None,
    catalogue_feed: MutableSequence[int] | None = None,
) -> None:
    """The engine process: run the engine until ``stop`` is set or the bridge is gone."""
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the bridge stops us
    # A signal handler must not take the stop event's lock: a SIGTERM to the whole process group
    # (coreutils' timeout, a shell's kill 0) arriving while this process held it in
    # stop.wait() deadlocked it, and the bridge with it, blocked in stop.set().
    asked = _Asked(stop)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: asked.set())
    logs.configure(settings.log_format, settings.log_level)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    writer: JournalWriter | None = None
    if journal is not None:  # the engine's own files, next to the bridge's
        spec, counters = journal
        writer = JournalWriter(spec, "engine", counters=counters).start()
    sinks: list[Sink] = [JournalSink(writer)] if writer is not None else []
    catalogue: Catalogue | None = None
    if settings.staged_catalogue:  # the same file as the bridge's process writes
        keeper = CatalogueWriter(settings.staged_catalogue, catalogue_counters).start()
        # Its answers wait for the bridge's process's writer too (``Catalogue.caught_up``).
        catalogue = Catalogue(settings.staged_catalogue, keeper,
                              [catalogue_feed] if catalogue_feed is not None else [])
        sinks.append(CatalogueSink(keeper))
    engine = Engine(staging_broker(settings), layout, stats=StagingStats(slots=slots),
                    level_prefetch=settings.staging_level_prefetch,
                    backoff_s=RECONNECT_S, backoff_jitter=RECONNECT_JITTER, sinks=sinks,
                    failures=FailureSettings(settings.message_retry, settings.redelivery,
                                             settings.undelivered_queue),
                    catalogue=catalogue)
    try:
        engine.run(asked)
    finally:
        if writer is not None:
            writer.close()
        if catalogue is not None:
            catalogue.close()


class _Asked:
    """The bridge's stop event, or a SIGTERM to this process: a plain flag, set without a lock
    (the engine looks at it at least every idle poll, 0.2 s)."""

    def __init__(self, event: multiprocessing.synchronize.Event) -> None:
        self.event = event
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag or self.event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.flag or self.event.wait(timeout)


def _die_with(parent: int) -> None:
    """Be killed when the bridge process goes, however it goes (Linux)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it went before the line above took effect
        os._exit(0)
