"""Messages RabbitMQ expires on its own queues, brought to the staging engine (``watch_expiries``).

RabbitMQ drops an expired message unless its queue has a dead-letter exchange. The adapter
declares one of the bridge's own, ``<prefix>.expired`` (fanout, bound to a queue of that name,
which the engine consumes); a queue's expired messages reach it when the queue names it:
- by a policy the bridge applies through the management API (``expiry_policy``: a pattern of
  queue names; off by default). Its priority is EXPIRY_POLICY_PRIORITY, below any an operator
  would give, so on a queue an operator's policy also matches, the operator's applies (RabbitMQ
  applies one policy to a queue, the highest priority's) and that queue's expired messages are
  not brought; a queue declared with its own ``x-dead-letter-exchange`` keeps it (a queue's
  argument beats a policy's key);
- or by the operator's own policies or queue arguments naming the exchange.
Whatever else such a queue dead-letters (a reject without requeue, a length limit's drop) comes
too; ``expiry_of`` says it is not an expiry, and the engine drops it, as RabbitMQ would have.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pika
from pika.adapters.blocking_connection import BlockingChannel
from pika.exchange_type import ExchangeType

from adapters.base import BrokerExpiry, Held, Message
from adapters.rabbitmq_connection import Connection, Tag
from adapters.rabbitmq_stomp import escape_queue, stomp_headers
from policies.endpoints import Endpoint

EXPIRY_POLICY_PRIORITY = -1000
EXPIRY_PREFETCH = 100
# What the broker adds to a dead letter: not the application's.
_DEATH = ("x-death", "x-first-death-queue", "x-first-death-reason", "x-first-death-exchange",
          "x-last-death-queue", "x-last-death-reason", "x-last-death-exchange")


def latest_death(props: pika.BasicProperties) -> dict[str, Any]:
    """The latest ``x-death`` entry of a dead letter (empty for a message that never died)."""
    deaths = (props.headers or {}).get("x-death")
    if not isinstance(deaths, list) or not deaths or not isinstance(deaths[0], dict):
        return {}
    return {k: v.decode() if isinstance(v, bytes) else v for k, v in deaths[0].items()}


def expiry_message(props: pika.BasicProperties, body: bytes) -> Message:
    """A delivery of the expired queue as the engine reads it: its STOMP headers, the latest
    death as ``x-death-reason``, ``-queue``, ``-time`` (epoch ms) and ``-original-expiration``,
    and boolean header fields as ``true``/``false`` (an AMQP JMS client sends
    JMS_TIBCO_PRESERVE_UNDELIVERED as one, which STOMP subscribers do not see)."""
    headers = stomp_headers(props)
    for name, value in (props.headers or {}).items():
        if isinstance(value, bool):
            headers.setdefault(name, "true" if value else "false")
    death = latest_death(props)
    for key in ("reason", "queue", "original-expiration"):
        if isinstance(death.get(key), str):
            headers[f"x-death-{key}"] = death[key]
    when = death.get("time")
    if isinstance(when, dt.datetime):
        headers["x-death-time"] = str(int(when.timestamp() * 1000))
    return Message(headers, body)


def rabbitmq_expiry(message: Message, now_ms: int) -> BrokerExpiry | None:
    """``expiry_of``: None unless its latest death was an expiry on a queue."""
    h = message.headers
    queue = h.get("x-death-queue")
    if h.get("x-death-reason") != "expired" or not queue:
        return None
    when = h.get("x-death-time", "")
    expired_ms = int(when) if when.isdigit() else now_ms
    own = {n: v for n, v in h.items()
           if n not in _DEATH and not n.startswith("x-death-")}
    ttl = h.get("x-death-original-expiration")
    if ttl:
        own["expiration"] = ttl  # its time to live as sent (RabbitMQ took it off)
    return BrokerExpiry(f"/amq/queue/{escape_queue(queue)}", expired_ms,
                        Message(own, message.body), h.get("amqp-message-id"))


def policy_pattern(pattern: str, own_queue: str) -> str:
    """``pattern``, never matching the bridge's own expired queue (its dead letters would come
    round again)."""
    own = "".join("\\" + c if not c.isalnum() else c for c in own_queue)
    return f"^(?!{own}$)(?:{pattern})"


class Expiries(Connection):
    """``watch_expiries`` and ``expiry_of`` of ``adapters.rabbitmq.RabbitMQ``."""

    _management: Endpoint | None
    _http_timeout: float
    _expiry_policy: str | None

    def watch_expiries(self, queue: str) -> str | None:
        """Declare the exchange ``queue`` (fanout) and the queue ``queue`` bound to it,
        consume the queue, and apply the expiry policy when one is set."""
        self.ensure_queues([queue])  # type: ignore[attr-defined]
        ch = self._scratch_channel()
        with self._translate():
            # (types-pika 1.2 types the members as str, the parameter as the enum)
            ch.exchange_declare(queue, ExchangeType.fanout, durable=True)  # type: ignore[arg-type]
            ch.queue_bind(queue, queue)
        ch = self._consumer_channel(queue, EXPIRY_PREFETCH)
        with self._translate():
            ch.basic_consume(queue, functools.partial(self._on_expired, queue), auto_ack=False)
        self._apply_policy(queue)
        return queue

    def expiry_of(self, message: Message) -> BrokerExpiry | None:
        return rabbitmq_expiry(message, _now_ms())

    def _on_expired(
        self, queue: str, _ch: BlockingChannel, method: pika.spec.Basic.Deliver,
        props: pika.BasicProperties, body: bytes,
    ) -> None:
        assert method.delivery_tag is not None
        self._holding.setdefault(queue, {})[method.delivery_tag] = None
        self._delivered.append(Held(queue, expiry_message(props, body),
                                    Tag(self._generation, method.delivery_tag, queue=queue)))

    def _apply_policy(self, queue: str) -> None:
        """PUT the policy ``queue`` (dead-letter-exchange: ``queue``) on the expiry pattern's
        queues; a refusal or an unreachable API is logged, not raised (the queues an operator
        routes to the exchange still come)."""
        pattern, ep = self._expiry_policy, self._management
        if pattern is None:
            return
        if ep is None:
            self._log.warning("expiry policy not applied: it needs RabbitMQ's management API "
                              "(--upstream-management)", policy=queue)
            return
        vhost = urllib.parse.quote(self.endpoint.vhost or "/", safe="")
        url = (f"http://{ep.host}:{ep.port}/api/policies/{vhost}/"
               f"{urllib.parse.quote(queue, safe='')}")
        body = {"pattern": policy_pattern(pattern, queue), "apply-to": "queues",
                "priority": EXPIRY_POLICY_PRIORITY,
                "definition": {"dead-letter-exchange": queue}}
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="PUT")
        token = base64.b64encode(f"{ep.user or 'guest'}:{ep.password or 'guest'}".encode())
        request.add_header("Authorization", "Basic " + token.decode())
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self._http_timeout):
                pass
        except urllib.error.HTTPError as exc:
            self._log.warning("expiry policy not applied", policy=queue, url=url,
                              error=f"HTTP {exc.code} {exc.reason}")
        except OSError as exc:
            self._log.warning("expiry policy not applied", policy=queue, url=url,
                              error=str(exc))
        else:
            self._log.info("expiry policy applied", policy=queue, pattern=body["pattern"],
                           priority=EXPIRY_POLICY_PRIORITY)


def _now_ms() -> int:
    return int(dt.datetime.now(dt.UTC).timestamp() * 1000)
