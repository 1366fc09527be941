"""Capped exponential backoff with jitter: one function for every wait that grows with failures.

Used by the reconnect loops (staging engine, its supervisor) and by the redelivery policy model.
Pure: the caller passes the random draw, so a test can pin it.
"""

from __future__ import annotations

__all__ = ["backoff_ms"]

_UNBOUNDED = 2**53


def backoff_ms(
    attempt: int,
    *,
    initial_ms: int,
    multiplier: float = 2.0,
    max_ms: int | None = None,
    jitter: float = 0.0,
    rand: float = 0.5,
) -> int:
    """The wait before try ``attempt`` (1 = the first retry): ``initial_ms * multiplier **
    (attempt - 1)``, capped at ``max_ms``, then spread by ``jitter`` (a fraction: 0.15 spreads
    it over +-15 %) with ``rand`` in [0, 1) choosing where (0.5 = no change). Never negative; the
    jitter never lifts a wait over ``max_ms``."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    if initial_ms < 0 or multiplier < 1.0 or not 0.0 <= jitter <= 1.0:
        raise ValueError(
            f"backoff needs initial_ms >= 0, multiplier >= 1 and jitter in [0, 1], got "
            f"{initial_ms}, {multiplier}, {jitter}"
        )
    # Without a cap a wait stops growing at 2**53 ms (285,000 years): a float stays exact there.
    cap = float(_UNBOUNDED) if max_ms is None or max_ms < 0 else float(max_ms)
    wait = float(initial_ms)
    for _ in range(attempt - 1):  # stepwise, so a huge attempt cannot overflow a float power
        if wait >= cap:
            break
        wait *= multiplier
    wait = min(wait, cap)
    if jitter:
        wait *= 1.0 + jitter * (2.0 * rand - 1.0)
    return max(0, round(min(wait, cap)))
