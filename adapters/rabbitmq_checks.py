"""Whether RabbitMQ would take a message, asked before it is put (``check_put``): a try on a
channel of its own, and a queue's length limits as RabbitMQ's management API shows them.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
from collections.abc import Mapping
from typing import Any

import pika.exceptions

from adapters.base import PutCheck
from adapters.rabbitmq_connection import Connection, close_quietly, refusal_reason
from adapters.rabbitmq_delayed import marker_of
from adapters.rabbitmq_management import get_json, queues_url
from adapters.rabbitmq_stomp import route
from policies.endpoints import Endpoint
from policies.errors import Refused
from policies.reasons import MQRC_Q_FULL

# Overflow behaviours under which a queue at its length limit refuses a publish (drop-head,
# the default, makes room by dropping its oldest message instead).
REFUSING_OVERFLOW = ("reject-publish", "reject-publish-dlx")


def queue_check(destination: str, info: Mapping[str, Any], ready: int) -> PutCheck:
    """Whether a queue would refuse a publish now, from its management view (``arguments``,
    ``effective_policy_definition``, ``message_bytes_ready``) and its exact ready count. A limit
    set both ways takes the lower value; the argument's overflow beats the policy's."""
    found = info.get("arguments")
    args: Mapping[str, Any] = found if isinstance(found, dict) else {}
    found = info.get("effective_policy_definition")
    policy: Mapping[str, Any] = found if isinstance(found, dict) else {}
    overflow = args.get("x-overflow", policy.get("overflow", "drop-head"))
    if overflow not in REFUSING_OVERFLOW:
        return PutCheck()

    def lowest(argument: str, key: str) -> int | None:
        values = [v for v in (args.get(argument), policy.get(key)) if isinstance(v, int)]
        return min(values) if values else None

    max_length = lowest("x-max-length", "max-length")
    max_bytes = lowest("x-max-length-bytes", "max-length-bytes")
    if max_length is None and max_bytes is None:
        return PutCheck()
    ready_bytes = info.get("message_bytes_ready")
    full = None
    if max_length is not None and ready >= max_length:
        full = f"holds {ready} ready messages, at most {max_length} ({overflow})"
    elif max_bytes is not None and isinstance(ready_bytes, int) and ready_bytes >= max_bytes:
        full = f"holds {ready_bytes} bytes of ready messages, at most {max_bytes} ({overflow})"
    refused = Refused(MQRC_Q_FULL, f"{destination} {full}") if full else None
    return PutCheck(refused, max_body_bytes=max_bytes, changing=True)


class Checks(Connection):
    """``check_put`` and ``staging_checks`` of ``adapters.rabbitmq.RabbitMQ``."""

    _management: Endpoint | None
    _http_timeout: float

    def check_put(self, destination: str) -> PutCheck:
        try:
            where = route(destination)
        except ValueError:
            return PutCheck()
        with self._translate():
            assert self._conn is not None
            ch = self._conn.channel()
        limits: Mapping[str, Any] | None = None
        ready = 0
        try:
            if where.queue and self._management is not None:
                limits = self._queue_info(where.routing_key)
            if where.queue and (limits is not None or not where.declare):
                # /amq/queue/ must exist; and how many messages are ready, exactly
                ready = ch.queue_declare(where.routing_key, passive=True).method.message_count or 0
            if where.exchange:  # permissions are checked at the publish, rolled back unseen
                ch.tx_select()
                ch.basic_publish(where.exchange, where.routing_key, b"")
                ch.tx_rollback()
        except pika.exceptions.ChannelClosedByBroker as exc:
            if self._conn is None or not self._conn.is_open or not self._main_open():
                with self._translate():
                    raise
            return PutCheck(Refused(
                refusal_reason(exc.reply_code, exc.reply_text),
                f"{destination}: the broker says ({exc.reply_code}) {exc.reply_text}",
            ))
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise
        finally:
            close_quietly(ch)
        if where.exchange and self._delayed(where.exchange):
            return PutCheck(delayed_exchange=True)
        return PutCheck() if limits is None else queue_check(destination, limits, ready)

    def _delayed(self, exchange: str) -> bool:
        """Whether ``exchange`` is a delayed-message exchange: its marker exists (a passive
        declare, on a channel of its own, which a 404 closes)."""
        with self._translate():
            assert self._conn is not None
            ch = self._conn.channel()
        try:
            ch.exchange_declare(marker_of(exchange), passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            if self._conn is None or not self._conn.is_open or not self._main_open():
                with self._translate():
                    raise
            return False  # 404: no marker, a plain exchange
        except (pika.exceptions.AMQPError, OSError):
            with self._translate():
                raise
        finally:
            close_quietly(ch)
        return True

    def staging_checks(self, destination: str) -> bool:
        """A staged copy is published to the default exchange, like a send to any queue; but
        that send says nothing of the queue's length limits."""
        if self._management is not None:
            return False
        try:
            where = route(destination)
        except ValueError:
            return False
        return where.exchange == "" and where.declare

    def _queue_info(self, queue: str) -> Mapping[str, Any] | None:
        """The management API's view of a queue: arguments, policy, ready bytes; None when it
        does not exist, or the API cannot be asked (logged: the other checks still count)."""
        assert self._management is not None
        url = (f"{queues_url(self._management, self.endpoint.vhost)}/"
               f"{urllib.parse.quote(queue, safe='')}"
               "?columns=arguments,effective_policy_definition,message_bytes_ready")
        try:
            info = get_json(self._management, url, self._http_timeout)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                self._log.warning("queue limits not seen", queue=queue, url=url,
                                  error=f"HTTP {exc.code} {exc.reason}")
            return None
        except (OSError, ValueError) as exc:
            self._log.warning("queue limits not seen", queue=queue, url=url, error=str(exc))
            return None
        return info if isinstance(info, dict) else None
