"""The engine's memory of what it let go of onto a staging queue, as the listings see it."""

from __future__ import annotations

from bridge.staging.engine_holding import MOVED_KEEP_MS, Holding
from bridge.staging.envelope import MESSAGE_ID


def _listed(holding: Holding, since_ms: int = 0) -> list[tuple[str, str]]:
    return [(queue, headers[MESSAGE_ID]) for queue, headers, _ in holding.listed_moved(since_ms)]


def test_a_message_that_left_the_staging_queues_is_not_listed_where_it_was_let_go_of() -> None:
    """A level head put back, then released: a listing right after its release showed it on
    its level, though it was on its target."""
    holding = Holding([])
    holding.let_go("L11", {MESSAGE_ID: "a"}, 3, now_ms=1_000)
    holding.let_go("L11", {MESSAGE_ID: "b"}, 3, now_ms=1_000)
    holding.gone("a", now_ms=1_500)
    assert _listed(holding) == [("L11", "b")]
    holding.let_go("L12", {MESSAGE_ID: "a"}, 3, now_ms=2_000)  # back on a level (a retry)
    assert _listed(holding) == [("L12", "a"), ("L11", "b")]
    assert _listed(holding, since_ms=1_500) == [("L12", "a")]


def test_what_is_forgotten_for_its_age_takes_its_departure_with_it() -> None:
    holding = Holding([])
    holding.let_go("L11", {MESSAGE_ID: "a"}, 3, now_ms=1_000)
    holding.gone("a", now_ms=1_500)
    holding.gone("never-let-go", now_ms=1_500)
    assert holding.left == {"a": 1_500}
    holding.let_go("L11", {MESSAGE_ID: "b"}, 3, now_ms=1_000 + MOVED_KEEP_MS + 1)
    assert holding.left == {} and _listed(holding) == [("L11", "b")]
    assert holding.moved_forgotten_ms == 1_000
