"""Test queues left on RabbitMQ: every durable queue a STOMP /queue/ destination declares stays
until deleted, and a suite run names about a thousand (``jbt-``). Left there, they slow the next
run down (each lane was 12-27 % faster once they were gone).

Each pytest process deletes, when it ends, the test queues without consumers that nobody has
used for ``IDLE_S``: other runs of the suite on the same broker (another worktree, another
engineer) may be using theirs right now, and a queue deleted under a running test takes its
messages with it. ``scripts/test``, once all its processes have ended, runs this module to
delete the rest of its own (``python -m tests.integration.leftovers --idle-s 0``)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

import pika

from tests.integration.brokers import BROKERS
from tests.integration.staging_util import management

IDLE_S = 300.0


def _stale(queue: dict[str, object], idle_s: float) -> bool:
    """A test queue without consumers, idle for ``idle_s`` (RabbitMQ's ``idle_since``)."""
    name, idle = queue.get("name"), queue.get("idle_since")
    if not isinstance(name, str) or not name.startswith("jbt-") or queue.get("consumers"):
        return False
    if not isinstance(idle, str):
        return False  # busy, or no statistics yet
    try:
        since = datetime.fromisoformat(idle.replace(" ", "T"))
    except ValueError:
        return False
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    return (datetime.now(UTC) - since).total_seconds() >= idle_s


def remove_test_queues(idle_s: float = IDLE_S) -> int:
    """Delete the stale test queues on the local RabbitMQ; how many. Nothing when it cannot be
    reached (the tests that needed it have failed already)."""
    broker = BROKERS["rabbitmq"]
    try:
        names = [q["name"] for q in management(
            broker, "/queues/%2F?columns=name,consumers,idle_since") if _stale(q, idle_s)]
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
    except (OSError, pika.exceptions.AMQPError):
        return 0
    try:
        channel = conn.channel()
        for name in names:
            channel.queue_delete(name)
    finally:
        conn.close()
    return len(names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle-s", type=float, default=IDLE_S,
                        help="delete those idle this long (default %(default)s)")
    args = parser.parse_args()
    print(f"deleted {remove_test_queues(args.idle_s)} test queues left on RabbitMQ")


if __name__ == "__main__":
    main()
