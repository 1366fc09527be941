"""The interceptors' clock rounds up, so a due time is never before the read plus the delay."""

from __future__ import annotations

import time

import pytest

from bridge.intercept import clock


@pytest.mark.parametrize(("ns", "ms"), [
    (1_000_000_000, 1000),       # on a millisecond: itself
    (1_000_000_001, 1001),       # just past one: the next
    (1_000_900_000, 1001),       # 1,000.9 ms: a floor would make a 25 ms delay 24.1 ms
])
def test_wall_ms_rounds_up(monkeypatch: pytest.MonkeyPatch, ns: int, ms: int) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: ns)
    assert clock.wall_ms_ceil() == ms


def test_interceptors_use_the_rounded_up_clock() -> None:
    from bridge.intercept.delay import DelayInterceptor
    from bridge.intercept.redelivery import RedeliveryInterceptor

    for cls in (DelayInterceptor, RedeliveryInterceptor):
        default = cls.__init__.__kwdefaults__ or {}
        assert default.get("clock") is clock.wall_ms_ceil, cls
