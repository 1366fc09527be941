"""The level queues: binary (ActiveMQ) and with second levels (RabbitMQ)."""

from __future__ import annotations

import pickle

import pytest

from adapters import activemq, rabbitmq
from bridge.staging.levels import Layout, layout_for

BINARY = Layout()
SECONDS = Layout(second_levels=True)


@pytest.mark.parametrize(
    ("remaining", "binary", "seconds"),
    [(1_023, "ready", "ready"), (1_024, "L10", "L10"), (2_047, "L10", "L10"),
     (3_071, "L11", "L11"), (3_072, "L11", "L10x03"), (5_000, "L12", "L12"),
     (7_200, "L12", "L10x07"), (16_383, "L13", "L10x15"), (16_384, "L14", "L14"),
     (30 * 86_400_000, "L31", "L31"), (1 << 40, "L32", "L32")],
)
def test_queue_for_is_the_largest_dwell_that_fits(remaining: int, binary: str,
                                                   seconds: str) -> None:
    for layout, name in ((BINARY, binary), (SECONDS, seconds)):
        queue = layout.queue_for(remaining)
        assert queue == f"{layout.prefix}.{name}"
        dwell = layout.dwell_of(queue)
        if name != "ready":
            assert dwell is not None and dwell <= remaining
            assert all(d <= dwell or d > remaining for d in layout.dwells)


def test_the_levels_and_their_dwells() -> None:
    assert BINARY.dwells == tuple(1 << k for k in range(10, 33))
    assert SECONDS.dwells[:16] == tuple(m << 10 for m in range(1, 17))
    assert SECONDS.dwells[15:] == tuple(1 << k for k in range(14, 33))
    for layout in (BINARY, SECONDS):
        assert [layout.dwell_of(q) for _, q in layout.levels] == list(layout.dwells)
        assert layout.queues[-1] == layout.ready and len(set(layout.queues)) == len(layout.queues)
    assert set(BINARY.queues) < set(SECONDS.queues)  # the same names mean the same dwells


@pytest.mark.parametrize("name", ["L10x03", "L10x3", "L11x03", "L10x16", "L10x04", "L33", "Lx",
                                  "ready", "L1O"])
def test_dwell_of_a_name_not_in_the_layout_is_none(name: str) -> None:
    assert BINARY.dwell_of(f"{BINARY.prefix}.{name}") is None
    expected = 3072 if name == "L10x03" else None
    assert SECONDS.dwell_of(f"{SECONDS.prefix}.{name}") == expected
    assert SECONDS.dwell_of(f"other.{name}") is None


def test_each_broker_has_its_layout_and_it_survives_pickling() -> None:
    rabbit, amq = layout_for(rabbitmq.FORMAT, "p"), layout_for(activemq.FORMAT, "p")
    assert rabbit.second_levels and not amq.second_levels
    assert pickle.loads(pickle.dumps(rabbit)) == rabbit  # sent to the engine process
    assert pickle.loads(pickle.dumps(rabbit)).dwells == rabbit.dwells
