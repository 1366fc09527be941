"""Quorum staging queues on a three-node RabbitMQ cluster: the node that leads them is
SIGKILLed under load, and every receipted delayed message is still released, none early
(``tests/integration/cluster.py`` says how). The killed node is started again at the end."""

from __future__ import annotations

from pathlib import Path

from tests.integration import cluster


def test_no_loss_when_the_staging_leader_node_is_killed(tmp_path: Path) -> None:
    cluster.require()
    r = cluster.node_loss(3000, tmp_path, rate=600, delays=(2000, 10_000), kill_after_s=2.5)
    print()
    cluster.show(r)
    assert r["queues_led"] == r["staging_queues"], r  # the killed node led every staging queue
    assert r["leader"] not in r["leaders_after"], r  # and they all moved
    assert r["receipted"] >= 2500, r  # the run was under load (a lost receipt is not a loss)
    assert r["lost"] == 0, r
    assert r["early"] == 0, r
    assert r["foreign"] == 0, r
    assert r["due_after_kill"] > 0, r  # messages did fall due after the kill
    assert r["bridge_exit"] == 0, r
    assert cluster.problem() is None  # the cluster is whole again
