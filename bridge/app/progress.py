"""Long tool runs: a progress bar on a terminal, and a clean stop on Ctrl-C.

The bar (tqdm: a count, a rate and an estimate) goes to stderr only when stderr is a terminal
and the output is not ``--json``; a pipe or a file gets nothing of it. ``interruptible`` turns
the first Ctrl-C into a request the work honours at its next safe point (between broker
transactions, between messages read); a second Ctrl-C stops at once. Either way the command
ends with one line saying what was done (``interrupted_line``) and exit status 130.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


_shown: list[Any] = []  # the bar on screen, if any: log lines are written above it


class Stderr:
    """sys.stderr for the logs: while a bar is shown, each whole line goes above the bar
    instead of through it."""

    def __init__(self) -> None:
        self._line = ""

    def write(self, text: str) -> int:
        if not _shown:
            return sys.stderr.write(text)
        self._line += text
        if "\n" in self._line:
            lines, _, self._line = self._line.rpartition("\n")
            with type(_shown[0]).external_write_mode(file=sys.stderr):
                sys.stderr.write(lines + "\n")
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()


class Progress:
    """A count (of messages unless ``unit`` says otherwise), shown as a bar when ``stream`` is
    a terminal and not ``quiet``."""

    def __init__(self, what: str, total: int | None, *, quiet: bool = False,
                 stream: TextIO | None = None, unit: str = " msg") -> None:
        self.done = 0
        self.total = total
        stream = sys.stderr if stream is None else stream
        self._bar = None
        if not quiet and stream.isatty():
            from tqdm import tqdm  # type: ignore[import-untyped]

            # A terminal that gives no size (some `docker exec -t`) would get an empty bar.
            sized = _columns(stream) > 0
            self._bar = tqdm(total=total, desc=what, unit=unit, file=stream, leave=True,
                             dynamic_ncols=sized, ncols=None if sized else 80,
                             nrows=None if sized else 24,
                             mininterval=0.2)
            _shown.append(self._bar)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)

    def reach(self, done: int, total: int | None) -> None:
        """The count and total as they are now (a Spark job's tasks: its total grows as its
        stages start)."""
        if self._bar is not None and total != self.total:
            self._bar.total = total
            self._bar.refresh()
        self.total = total
        self.advance(done - self.done)

    def close(self) -> None:
        if self._bar is not None:
            _shown.remove(self._bar)
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


@contextmanager
def interruptible() -> Iterator[Callable[[], bool]]:
    """While inside: the first SIGINT only sets the flag the yielded function reads; the next
    one raises KeyboardInterrupt as usual. Outside (or off the main thread): unchanged."""
    asked = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield asked.is_set
        return

    def ask(_signum: int, _frame: FrameType | None) -> None:
        asked.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, ask)
    try:
        yield asked.is_set
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupted_line(done: int, total: int | None, verb: str, rest: str) -> str:
    """``interrupted: 1,234 of 5,000 exported; the rest stays on the queue``."""
    of = f" of {total:,}" if total is not None else ""
    return f"interrupted: {done:,}{of} {verb}; {rest}"


__all__ = ["EXIT_INTERRUPTED", "Progress", "Stderr", "interruptible", "interrupted_line"]
