"""Prometheus metrics of the bridge.

The relay counts frames on its hot path in plain dicts (an ``inc()`` on a labelled prometheus
counter takes a lock per call); a collector turns the dicts into counter families when
``/metrics`` is scraped.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from bridge.frontends.stats import RelayStats


class _RelayCollector(Collector):
    def __init__(self, stats: RelayStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.stats
        yield GaugeMetricFamily(
            "jms_bridge_connections_open", "Client connections open now.", value=s.connections_open
        )
        yield CounterMetricFamily(
            "jms_bridge_connections", "Client connections accepted.", value=s.connections_total
        )
        frames = CounterMetricFamily(
            "jms_bridge_frames_relayed",
            "Frames relayed, by protocol command and direction (upstream = client to broker).",
            labels=["command", "direction"],
        )
        for direction, tally in (("upstream", s.frames_up), ("downstream", s.frames_down)):
            for command, n in sorted(tally.items()):
                frames.add_metric([command, direction], n)
        yield frames
        yield _by_label("jms_bridge_bytes_relayed", "Bytes relayed, by direction.",
                        "direction", s.bytes)
        yield _by_label("jms_bridge_heartbeats_relayed", "Heart-beat EOLs relayed.",
                        "direction", s.heartbeats)
        yield _by_label("jms_bridge_protocol_errors", "Protocol errors, by kind.",
                        "kind", s.protocol_errors)
        yield _by_label("jms_bridge_sends_refused", "Sends refused by a policy, by MQRC reason.",
                        "reason", s.refusals)
        yield _by_label("jms_bridge_failed_deliveries",
                        "Deliveries consumers failed (NACK, rollback, lost connection), by what "
                        "the redelivery policy did.", "action", s.redeliveries)
        yield _by_label("jms_bridge_dead_letters",
                        "Failed deliveries moved to a dead-letter or the undelivered queue, or "
                        "deleted, by reason.", "reason", s.dead_letters)


def _by_label(name: str, doc: str, label: str, tally: Tally[str]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, n in sorted(tally.items()):
        family.add_metric([key], n)
    return family


class Metrics:
    """The registry of one bridge process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.relay = RelayStats()
        self.registry.register(_RelayCollector(self.relay))

    def render(self) -> bytes:
        return generate_latest(self.registry)
