"""Which statistics request counts a set of queues at once
(adapters.activemq_statistics.wildcard_scope)."""

from __future__ import annotations

import pytest

from adapters.activemq_statistics import wildcard_scope


@pytest.mark.parametrize(
    ("names", "scope"),
    [
        (["jms-bridge.staging.L10", "jms-bridge.staging.ready"], "jms-bridge.staging"),
        (["a.b", "a.b.c"], "a"),  # a.> matches both; a.b.> would miss a.b itself
        (["a.b.c", "a.d"], "a"),
        (["x", "y"], None),  # nothing in common
        (["x.a", "y.a"], None),
        (["q.a"], None),  # one queue: its own request
        (["a.*.c", "a.b.c"], None),  # a wildcard in a name
        (["a.b>", "a.c"], None),
        ([".a", ".b"], None),  # an empty segment
    ],
)
def test_wildcard_scope(names: list[str], scope: str | None) -> None:
    assert wildcard_scope(names) == scope
