"""What a link counts of the events the connection gives it, into its plain counters
(``relay_stats``): method frames by method, heartbeats, and the channels a client opens and
closes."""

from __future__ import annotations

from collections import Counter as Tally
from typing import Final

from pamqp import commands

from bridge.frontends.amqp.assembler import Message
from bridge.frontends.amqp.connection import DeliveryRun, Event, PlainRun
from bridge.frontends.amqp.framer import FRAME_HEARTBEAT, FRAME_METHOD, Frame
from bridge.frontends.relay_stats import AmqpStats

CHANNEL_OPEN_OK: Final = commands.Channel.OpenOk.index
CHANNEL_CLOSE_OK: Final = commands.Channel.CloseOk.index
BASIC_PUBLISH: Final = commands.Basic.Publish.index
BASIC_DELIVER: Final = commands.Basic.Deliver.index
BASIC_ACK: Final = commands.Basic.Ack.index


def count(events: list[Event], tally: Tally[int], stats: AmqpStats, own: int | None,
          channels: int) -> int:
    """Count ``events`` into ``tally`` (``stats.methods_up`` or ``methods_down``) and
    ``stats``; returns how many channels the link has open after them (``channels`` before).
    The bridge's own channel (``own``) is not the client's traffic."""
    for event in events:
        if type(event) is Frame:
            if event.channel == own:
                continue
            if event.type == FRAME_METHOD:
                index = event.method_index
                tally[index] += 1
                if index == CHANNEL_OPEN_OK:
                    stats.channels_open += 1
                    stats.channels_total += 1
                    channels += 1
                elif index == CHANNEL_CLOSE_OK and channels:
                    stats.channels_open -= 1
                    channels -= 1
            elif event.type == FRAME_HEARTBEAT:
                stats.heartbeats["upstream" if tally is stats.methods_up else "downstream"] += 1
        elif type(event) is Message:
            if event.channel != own:
                tally[event.method_frame.method_index] += 1
        elif type(event) is PlainRun:
            tally[BASIC_PUBLISH] += event.publishes
        elif type(event) is DeliveryRun:
            tally[BASIC_DELIVER] += len(event.deliveries)
            tally[BASIC_ACK] += event.confirms
    return channels
