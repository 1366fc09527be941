"""Keeps clients off the staging area: its queues and its control topic are the bridge's own."""

from __future__ import annotations

from bridge.intercept.chain import Interceptor, Interest
from bridge.intercept.decisions import RELAY, Decision, Refuse
from bridge.intercept.views import Send, Subscribe
from bridge.staging.levels import Layout
from policies.errors import Refused
from policies.reasons import MQRC_NOT_AUTHORIZED


class StagingGuard(Interceptor):
    """Refuses a send to, or a subscription on, a staging queue or the control topic, also as a
    part of an ActiveMQ composite destination or through a queue wildcard."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        # A send can only reach the staging area by naming its prefix; a subscription (rare)
        # may reach it by a wildcard without the prefix, so every one is looked at.
        self.interest = Interest(send_mentions=(layout.prefix,), subscribes=True)

    def on_send(self, send: Send) -> Decision:
        if self.layout.prefix not in send.destination:
            return RELAY  # the chain offers it every send some interceptor screened
        return self._judge(send.destination, "send to")

    def on_subscribe(self, subscribe: Subscribe) -> Decision:
        return self._judge(subscribe.destination, "subscribe to")

    def _judge(self, destination: str, verb: str) -> Decision:
        if not self.layout.owns(destination):
            return RELAY
        return Refuse(Refused(
            MQRC_NOT_AUTHORIZED,
            f"{destination} is a jms-bridge staging queue or control topic: clients may not "
            f"{verb} it",
        ))
