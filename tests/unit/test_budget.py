"""The process-wide budget of bytes held for clients: who is told to wait, and that the first
holder always goes on (so the budget never deadlocks)."""

from __future__ import annotations

import random

import pytest

from bridge.frontends.budget import Budget


class Link:
    def __init__(self, name: str) -> None:
        self.name = name
        self.resumed = 0

    def budget_resume(self) -> None:
        self.resumed += 1


def test_under_the_budget_nobody_waits() -> None:
    budget = Budget(100)
    a, b = Link("a"), Link("b")
    assert not budget.update(a, 40)
    assert not budget.update(b, 50)
    assert budget.total == 90


def test_past_the_budget_later_holders_wait_and_the_first_goes_on() -> None:
    budget = Budget(100)
    a, b, c = Link("a"), Link("b"), Link("c")
    assert not budget.update(a, 60)
    assert not budget.update(b, 30)
    assert budget.update(c, 20)  # 110 > 100: c waits
    assert budget.update(b, 40)  # b grows past it: waits too
    assert not budget.update(a, 90)  # the first holder is never told to wait
    budget.update(a, 0)  # a's frame passed on: 60 held, b then c go on, in order
    assert (b.resumed, c.resumed) == (1, 1)
    assert budget.total == 60


def test_the_new_first_holder_is_woken_even_over_the_budget() -> None:
    budget = Budget(10)
    a, b, c = Link("a"), Link("b"), Link("c")
    budget.update(a, 8)
    assert budget.update(b, 8)
    assert budget.update(c, 8)
    budget.update(a, 0)  # 16 held, over the budget: only b (now first) goes on
    assert (b.resumed, c.resumed) == (1, 0)
    budget.update(b, 0)
    assert c.resumed == 1


def test_a_gone_connection_frees_what_it_held() -> None:
    budget = Budget(10)
    a, b = Link("a"), Link("b")
    budget.update(a, 8)
    assert budget.update(b, 8)
    budget.forget(a)
    assert b.resumed == 1 and budget.total == 8
    budget.forget(b)
    assert budget.total == 0


def test_random_traffic_always_drains() -> None:
    """Whatever the order, every holder completes: the waiters are woken in the end."""
    rng = random.Random(3)
    budget = Budget(1000)
    links = [Link(str(i)) for i in range(20)]
    want = {link: rng.randint(100, 900) for link in links}
    held = dict.fromkeys(links, 0)
    paused: set[Link] = set()
    done: set[Link] = set()
    for _ in range(100_000):
        if len(done) == len(links):
            break
        for link in links:  # woken ones read again
            if link.resumed:
                link.resumed = 0
                paused.discard(link)
        readers = [x for x in links if x not in paused and x not in done]
        assert readers, "deadlock: every unfinished connection is told to wait"
        link = rng.choice(readers)
        held[link] = min(want[link], held[link] + rng.randint(1, 200))
        if held[link] == want[link]:  # complete: passed on
            held[link] = 0
            budget.update(link, 0)
            done.add(link)
        elif budget.update(link, held[link]):
            paused.add(link)
    assert len(done) == len(links) and budget.total == 0


def test_a_budget_needs_a_byte() -> None:
    with pytest.raises(ValueError):
        Budget(0)
