"""Prometheus metrics of the bridge.

The relay counts frames on its hot path in plain dicts (an ``inc()`` on a labelled prometheus
counter takes a lock per call); a collector turns the dicts into counter families when
``/metrics`` is scraped.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator, MutableSequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.deadletter.deadletter_stats import DeadLetterStats
from bridge.frontends.amqp.framer import method_name
from bridge.frontends.relay_stats import AmqpStats, RelayStats


class WriterCollector(Collector):
    """``<name>_written_total`` and ``<name>_dropped_total`` of a sink's writer threads
    (``bridge.staging.outcomes.CountedWriter``), summed over the processes' counters (the
    bridge's and its engine's, in shared memory)."""

    def __init__(self, name: str, written: str, dropped: str,
                 *counters: MutableSequence[int]) -> None:
        self.name, self.written_help, self.dropped_help = name, written, dropped
        self.counters = counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(f"{self.name}_written", self.written_help,
                                  value=sum(int(c[0]) for c in self.counters))
        yield CounterMetricFamily(f"{self.name}_dropped", self.dropped_help,
                                  value=sum(int(c[1]) + int(c[2]) for c in self.counters))


class _RelayCollector(Collector):
    """The counters of one front-end; ``prefix`` names its families (``jms_bridge`` for STOMP,
    ``jms_bridge_amqp`` for AMQP 0-9-1)."""

    def __init__(self, stats: RelayStats, prefix: str = "jms_bridge") -> None:
        self.stats = stats
        self.prefix = prefix

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s, p = self.stats, self.prefix
        yield GaugeMetricFamily(
            f"{p}_connections_open", "Client connections open now.", value=s.connections_open
        )
        yield CounterMetricFamily(
            f"{p}_connections", "Client connections accepted.", value=s.connections_total
        )
        frames = CounterMetricFamily(
            f"{p}_frames_relayed",
            "Frames relayed, by protocol command and direction (upstream = client to broker).",
            labels=["command", "direction"],
        )
        for direction, tally in (("upstream", s.frames_up), ("downstream", s.frames_down)):
            for command, n in sorted(tally.items()):
                frames.add_metric([command, direction], n)
        yield frames
        yield GaugeMetricFamily(
            f"{p}_buffered_bytes", "Bytes held for clients now: frames not yet complete or "
            "not yet taken by the broker (bounded by --max-buffered-bytes).",
            value=s.buffered_bytes)
        yield CounterMetricFamily(
            f"{p}_budget_pauses", "Times a client was told to wait (not read) because the "
            "bytes held for all clients were at --max-buffered-bytes.", value=s.budget_pauses)
        yield _by_label(f"{p}_bytes_relayed", "Bytes relayed, by direction.",
                        "direction", s.bytes)
        yield _by_label(f"{p}_heartbeats_relayed", "Heart-beat EOLs relayed.",
                        "direction", s.heartbeats)
        yield _by_label(f"{p}_protocol_errors", "Protocol errors, by kind.",
                        "kind", s.protocol_errors)
        yield _by_label(f"{p}_sends_refused", "Sends refused by a policy, by MQRC reason.",
                        "reason", s.refusals)
        yield _by_label(f"{p}_failed_deliveries",
                        "Deliveries consumers failed (NACK, rollback, lost connection), by what "
                        "the redelivery policy did.", "action", s.redeliveries)
        yield _by_label(f"{p}_dead_letters",
                        "Failed deliveries moved to a dead-letter or the undelivered queue, or "
                        "deleted, by reason.", "reason", s.dead_letters)


class _AmqpCollector(Collector):
    """What only the AMQP front-end counts: its method frames by name, and its channels."""

    def __init__(self, stats: AmqpStats, prefix: str = "jms_bridge_amqp") -> None:
        self.stats = stats
        self.prefix = prefix

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s, p = self.stats, self.prefix
        yield GaugeMetricFamily(f"{p}_channels_open", "AMQP channels open now (client side).",
                                value=s.channels_open)
        yield CounterMetricFamily(f"{p}_channels", "AMQP channels opened by clients.",
                                  value=s.channels_total)
        frames = CounterMetricFamily(
            f"{p}_methods_relayed",
            "AMQP method frames, by method and direction (upstream = client to broker).",
            labels=["method", "direction"],
        )
        for direction, tally in (("upstream", s.methods_up), ("downstream", s.methods_down)):
            for index, n in sorted(tally.items()):
                frames.add_metric([method_name(index), direction], n)
        yield frames


def _by_label(name: str, doc: str, label: str, tally: Tally[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(tally.items()):
        family.add_metric([key], n)
    return family


class _DeadLetterCollector(Collector):
    def __init__(self, stats: DeadLetterStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "jms_bridge_dlq_actions",
            "Messages the dead-letter tools purged, replayed, moved or exported, and the rules "
            "handler's actions (handle-RETRY, handle-FWD, handle-DISCARD, handle-IGNORE), by "
            "the dead letter's reason.", labels=["operation", "reason"])
        for (operation, reason), n in sorted(self.stats.actions.items()):
            family.add_metric([operation, reason], n)
        yield family


class Metrics:
    """The registry of one bridge process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.relay = RelayStats()
        self.amqp = AmqpStats()
        self.deadletters = DeadLetterStats()
        self.registry.register(_RelayCollector(self.relay))
        self.registry.register(_DeadLetterCollector(self.deadletters))

    def count_amqp(self) -> AmqpStats:
        """Export the AMQP front-end's counters too, as ``jms_bridge_amqp_*``."""
        self.registry.register(_RelayCollector(self.amqp, "jms_bridge_amqp"))
        self.registry.register(_AmqpCollector(self.amqp))
        return self.amqp

    def render(self) -> bytes:
        return generate_latest(self.registry)
