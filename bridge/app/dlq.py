"""The ``jms-bridge dlq`` subcommands: argument parsing and running (``bridge.deadletter``
does the work). Exit codes as ``jms-bridge staged``: 0 done, 1 failed (one line on stderr
naming the problem and the MQRC reason where there is one), 2 bad usage, 3 no such queue."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from adapters.queues import QueueTools, Visit
from bridge.app.config import Settings, bridge_amqp, bridge_stomp, parse_hostport
from bridge.app.progress import EXIT_INTERRUPTED, Progress, interrupted_line, interruptible
from bridge.deadletter import archive, ops
from bridge.deadletter.handler import Handler
from policies.dlqrules import Rules, parse_rules
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, ConfigError, PutRefused
from policies.naming import queue_name
from policies.selector import HeaderMap, for_broker

EXIT_FAILURE = 1
EXIT_NOT_FOUND = 3
def queue_tools(settings: Settings) -> QueueTools:
    if settings.broker == "rabbitmq":
        from adapters.queues_rabbitmq import RabbitMQQueues

        return RabbitMQQueues(bridge_amqp(settings), management=settings.upstream_management)
    from adapters.queues_activemq import ActiveMQQueues

    # A COMMIT of a batch can take seconds on a busy broker: not an outage (and either way a
    # batch is all done or not at all).
    return ActiveMQQueues(bridge_stomp(settings), receipt_timeout=60.0)


def header_map(settings: Settings) -> HeaderMap:
    return for_broker(settings.broker)


def _destination(text: str) -> str:
    return text if text.startswith("/") else f"/queue/{text}"


def _limit(ns: argparse.Namespace) -> int | None:
    limit = getattr(ns, "limit", None)
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit: expected a whole number of at least 1, got {limit}")
    return limit


def run(ns: argparse.Namespace, settings: Settings) -> int:
    limit = _limit(ns)
    queue = ns.queue if isinstance(ns.queue, str) and ns.queue else settings.undelivered_queue
    queue = queue_name(queue, settings.broker)  # /queue/X, /amq/queue/X or X: the queue X
    picker = ops.Picker.of(getattr(ns, "selector", None), header_map(settings))
    rules = None
    metrics_at = None
    if ns.action == "handle":
        rules = _rules(ns.rules, settings)
        if ns.metrics_listen:
            metrics_at = parse_hostport(ns.metrics_listen, "--metrics-listen")
        if not (isinstance(ns.queue, str) and ns.queue) and rules.control.inputq:
            queue = queue_name(rules.control.inputq, settings.broker)
    if ns.action == "purge" and picker.selector is None and not ns.all:
        raise ConfigError("dlq purge without --selector removes every message: add --all")
    tools = queue_tools(settings)
    tools.connect()
    try:
        if ns.action == "list":
            named = [queue_name(q, settings.broker) for q in ns.queue or ()]
            listing = ops.candidates(tools, prefix=settings.staging_prefix, named=named)
            print(ops.render_list(listing, as_json=ns.json))
            return 0
        size = tools.size(queue)
        if size is None:
            print(f"jms-bridge: no queue {queue!r} on the broker", file=sys.stderr)
            return EXIT_NOT_FOUND
        if ns.action == "count":
            print(ops.count(tools, queue, picker))
            return 0
        if ns.action == "browse":
            entries = list(ops.browse(tools, queue, picker, limit=limit))
            print(ops.render_entries(entries, as_json=ns.json, body=ns.body))
            return 0
        if ns.action == "export":
            return _export(tools, ns, queue, picker, limit, size)
        if ns.action == "handle":
            assert rules is not None
            return _handle(tools, rules, queue, ns.once, metrics_at)
        fmt = tools.format  # type: ignore[attr-defined]
        to = _destination(ns.to) if getattr(ns, "to", None) else None
        with interruptible() as stop, Progress(ns.action, size, quiet=ns.json) as progress:
            outcome = ops.change(tools, ns.action, queue, picker, fmt, limit=limit, to=to,
                                 on_seen=progress.advance, stop=stop)
        if outcome.interrupted:
            print(interrupted_line(outcome.done, size, _DONE[ns.action],
                                   "the rest stays on the queue"), file=sys.stderr)
            return EXIT_INTERRUPTED
        if ns.json:
            print(json.dumps(outcome.as_dict(), indent=2))
        else:
            print(outcome.describe())
        if outcome.error is not None:
            print(f"jms-bridge: {outcome.error}", file=sys.stderr)
            return EXIT_FAILURE
        return 0
    finally:
        tools.close()


_DONE = {"purge": "purged", "replay": "replayed", "move": "moved"}


def _rules(path: str, settings: Settings) -> Rules:
    from bridge.deadletter.metadata import selector_headers

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--rules {path}: cannot read it: {exc}") from None
    return parse_rules(text, source=path, header_map=selector_headers(header_map(settings)))


def _handle(tools: QueueTools, rules: Rules, queue: str, once: bool,
            metrics_at: Endpoint | None) -> int:
    from bridge.app.metrics import Metrics

    metrics = Metrics()
    if metrics_at is not None:
        from prometheus_client import start_http_server

        try:
            start_http_server(metrics_at.port, metrics_at.host, registry=metrics.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-listen {metrics_at}: {exc}") from None
    handler = Handler(tools, rules, queue, tools.format,  # type: ignore[attr-defined]
                      stats=metrics.deadletters)

    # SIGTERM ends the handler between passes (or its wait between them): raised in the middle
    # of a sweep, an exception could leave pika unable to close the sweep's channel.
    stopping = threading.Event()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        stopping.set()

    def pause(seconds: float) -> None:
        stopping.wait(seconds)

    signal.signal(signal.SIGTERM, stop)
    try:
        totals = handler.run(once=once, stop=stopping.is_set, sleep=pause)
    except KeyboardInterrupt:
        print(f"stopped: {handler.totals.describe()}")
        return 0
    except (PutRefused, BrokerUnavailable) as exc:
        print(handler.totals.describe())
        print(f"jms-bridge: dlq handle {queue}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if stopping.is_set():
        print(f"stopped: {totals.describe()}")
        return 0
    print(totals.describe())
    return 0


def _export(tools: QueueTools, ns: argparse.Namespace, queue: str, picker: ops.Picker,
            limit: int | None, size: int) -> int:
    writer = archive.Writer(Path(ns.to), queue, ns.format)
    broker = tools.name
    if not ns.remove:
        rows = []
        with interruptible() as stop, Progress("export", size) as progress:
            for entry in ops.browse(tools, queue, picker, limit=limit,
                                    on_seen=progress.advance, stop=stop):
                rows.append(archive.row(queue, broker, entry.broker_id, entry.position,
                                        entry.headers, entry.body,
                                        now_ms=time.time_ns() // 1_000_000))
                if len(rows) >= 100_000:
                    writer.write(rows)
                    rows = []
            writer.write(rows)
        if stop():
            print(interrupted_line(writer.rows, size, f"exported to {ns.to}",
                                   "every message stays on the queue"), file=sys.stderr)
            return EXIT_INTERRUPTED
        print(f"exported {writer.rows} messages of {queue} to {len(writer.files)} file(s) "
              f"in {ns.to}")
        return 0

    def to_disk(visits: Sequence[Visit]) -> None:
        writer.write(archive.visit_rows(queue, broker, visits))

    with interruptible() as stop, Progress("export", size) as progress:
        outcome = ops.change(tools, "purge", queue, picker,
                             tools.format,  # type: ignore[attr-defined]
                             limit=limit, batch=1000, before_commit=to_disk, label="export",
                             on_seen=progress.advance, stop=stop)
    if outcome.interrupted:
        print(interrupted_line(outcome.done, size, f"exported to {ns.to} and removed",
                               "the rest stays on the queue"), file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"exported and removed {outcome.done} messages of {queue} to {len(writer.files)} "
          f"file(s) in {ns.to}")
    if outcome.error is not None:
        print(f"jms-bridge: {outcome.error}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


__all__ = ["queue_tools", "run"]
