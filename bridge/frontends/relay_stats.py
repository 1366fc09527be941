"""Plain counters a front-end bumps per frame and per connection: no metrics library on the hot
path (an ``inc()`` on a labelled prometheus counter takes a lock); ``bridge.app.metrics`` exports
them when ``/metrics`` is scraped."""

from __future__ import annotations

from collections import Counter as Tally


class RelayStats:
    """Counters the STOMP relay bumps per frame and per connection."""

    def __init__(self) -> None:
        self.connections_open = 0
        self.connections_total = 0
        self.frames_up: Tally[str] = Tally()  # command -> n, client to broker
        self.frames_down: Tally[str] = Tally()  # command -> n, broker to client
        self.bytes: Tally[str] = Tally()  # direction -> n
        self.protocol_errors: Tally[str] = Tally()  # kind -> n
        self.heartbeats: Tally[str] = Tally()  # direction -> n
        self.refusals: Tally[str] = Tally()  # reason name -> n
        # Consumers' failed deliveries, by what their policy did: redelivered, dead-lettered,
        # undelivered, deleted; and those that left their queue, by reason.
        self.redeliveries: Tally[str] = Tally()
        self.dead_letters: Tally[str] = Tally()
        # Bytes held for clients now (frames not yet complete or not yet taken by the broker),
        # and how often a client was told to wait because their sum was at the budget.
        self.buffered_bytes = 0
        self.budget_pauses = 0


class AmqpStats(RelayStats):
    """The AMQP front-end's counters: method frames by method index (named when exported),
    channels, and the rest as the STOMP relay's."""

    def __init__(self) -> None:
        super().__init__()
        self.methods_up: Tally[int] = Tally()  # method index -> n, client to broker
        self.methods_down: Tally[int] = Tally()
        self.channels_open = 0
        self.channels_total = 0
