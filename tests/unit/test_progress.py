"""The progress bar's rules without a broker: nothing on a pipe, the bar on a terminal, and the
one line an interrupted run leaves."""

from __future__ import annotations

import io
import os
import select
import signal

import pytest

from bridge.app.progress import Progress, interrupted_line, interruptible


def test_nothing_is_drawn_on_a_stream_that_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with Progress("export", 10, stream=stream) as progress:
        progress.advance(3)
    assert progress.done == 3 and stream.getvalue() == ""


def test_the_bar_on_a_terminal_counts_and_json_turns_it_off() -> None:
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            with Progress("export", 10, stream=tty) as progress:
                progress.advance(10)
            with Progress("export", 10, stream=tty, quiet=True) as quiet:
                quiet.advance(10)
            tty.flush()
        drawn = b""
        while select.select([master], [], [], 0.2)[0]:  # all of it, however it was split
            drawn += os.read(master, 65536)
    finally:
        os.close(master)
        os.close(slave)
    text = drawn.decode()
    assert "10/10" in text and "msg/s" in text
    assert text.count("10/10 [") >= 1  # the quiet one drew nothing more


def test_the_interrupted_line() -> None:
    assert interrupted_line(1234, 5000, "exported", "the rest stays on the queue") == (
        "interrupted: 1,234 of 5,000 exported; the rest stays on the queue")


def test_the_first_ctrl_c_asks_and_the_second_stops() -> None:
    before = signal.getsignal(signal.SIGINT)  # (a SparkSession of another test sets its own)
    with interruptible() as asked:
        assert not asked()
        signal.raise_signal(signal.SIGINT)
        assert asked()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
