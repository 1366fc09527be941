"""Quorum staging queues on a three-node RabbitMQ cluster: the node that leads them is
SIGKILLed under load, and every receipted delayed message is still released, none early
(``tests/integration/cluster.py`` says how). The killed node is started again at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from adapters.base import Message, Move
from adapters.rabbitmq import FORMAT, RabbitMQ
from bridge.staging.levels import layout_for
from policies.endpoints import Endpoint
from tests.integration import cluster
from tests.integration.bridgeproc import free_port


@pytest.mark.parametrize("bridge_on_leader", [False, True], ids=["bridge-elsewhere",
                                                                "bridge-on-the-killed-node"])
def test_no_loss_when_the_staging_leader_node_is_killed(tmp_path: Path,
                                                        bridge_on_leader: bool) -> None:
    """The bridge on another node; or on the killed one, with another node as its alternate
    (then the producer's connection goes with the node, and it reconnects)."""
    cluster.require()
    r = cluster.node_loss(3000, tmp_path, rate=600, delays=(2000, 10_000), kill_after_s=2.5,
                          bridge_on_leader=bridge_on_leader)
    print()
    cluster.show(r)
    assert r["queues_led"] == r["staging_queues"], r  # the killed node led every staging queue
    assert r["leader"] not in r["leaders_after"], r  # and they all moved
    # Enough went through the kill to count (a lost receipt is not a loss: with the bridge on
    # the killed node, a loaded machine saw over a third of the sends go without one).
    assert r["receipted"] >= r["messages"] // 3, r
    assert r["lost"] == 0, r
    assert r["early"] == 0, r
    assert r["foreign"] == 0, r
    assert r["with_x_delivery_count"] == 0, r  # the staging queues' header stays there
    assert r["due_after_kill"] > 0, r  # messages did fall due after the kill
    assert r["bridge_exit"] == 0, r
    assert cluster.problem() is None  # the cluster is whole again


def test_a_quorum_level_gives_its_head_back_in_place() -> None:
    """The engine peeks a long level's head and gives it back when it is not due: on a quorum
    queue it must stay the head (a delivery limit keeps it there on RabbitMQ 3.10), and the
    broker's x-delivery-count must not reach the message."""
    cluster.require()
    node = cluster.NODES[1]
    queue = f"jbt-cluster-{uuid.uuid4().hex[:8]}.L20"
    broker = RabbitMQ(Endpoint("127.0.0.1", node.amqp, "guest", "guest", "/"),
                      queue_type="quorum")
    broker.connect()
    try:
        broker.ensure_queues([queue])
        for i in range(3):
            broker.publish(f"/amq/queue/{queue}", Message({"seq": str(i)}, b"x"))
        for _ in range(3):
            held = broker.peek(queue)
            assert held is not None and held.message.headers["seq"] == "0"
            assert "x-delivery-count" not in held.message.headers
            broker.put_back(held)
        broker.close()  # what a lost connection does with held messages: give them back
        broker.connect()
        seen = []
        for _ in range(3):
            held = broker.peek(queue)
            assert held is not None
            seen.append(held.message.headers["seq"])
            broker.settle([Move(held, None, None)])
        assert seen == ["0", "1", "2"]
    finally:
        broker.close()
        cluster.delete_queues(node, [queue])


@pytest.mark.parametrize(("existing", "asked"), [("classic", "quorum"), ("quorum", "classic")])
def test_staging_queues_of_the_other_type_end_the_bridge_naming_them(
    tmp_path: Path, existing: str, asked: str
) -> None:
    cluster.require()
    node = cluster.NODES[1]
    layout = layout_for(FORMAT, f"jbt-cluster-{uuid.uuid4().hex[:8]}")
    cluster.declare_staging(node, layout, existing)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    env["PYTHONPATH"] = str(cluster.ROOT)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "bridge.app.cli", "run", "--log-level", "error",
             "--upstream-stomp", f"stomp://127.0.0.1:{node.stomp}",
             "--upstream-amqp", f"amqp://guest:guest@127.0.0.1:{node.amqp}/%2F",
             "--stomp-listen", f"127.0.0.1:{free_port()}",
             "--admin-listen", f"127.0.0.1:{free_port()}",
             "--staging-prefix", layout.prefix, "--staging-queue-type", asked],
            capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    finally:
        cluster.delete_queues(node, list(layout.all_queues))
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"staging queue '{layout.level_of(1024)}'" in lines[0], lines[0]
    assert f"--staging-queue-type {asked}" in lines[0] and "--staging-prefix" in lines[0]
