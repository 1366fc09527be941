"""The interceptors' clock: wall time in epoch milliseconds, rounded up.

A due time is this clock plus a delay. Rounded down, a NACK read at 1,000.9 ms with a 25 ms
delay was due at 1,025 ms and released 24.1 ms after the NACK (the redelivery bench saw 51 of
9,000 redeliveries up to 0.4 ms early); rounded up, a due time is never before the instant the
bridge read the frame plus the delay.
"""

from __future__ import annotations

import time


def wall_ms_ceil() -> int:
    return -(-time.time_ns() // 1_000_000)
