"""Queue depths and consumer counts on ActiveMQ: ``depth``, ``consumers`` and ``depths``.

What this relies on, checked against ActiveMQ 5.17 (tests/integration/test_adapters.py):
- Queue depths come from the statistics plugin (``<statisticsBrokerPlugin/>``): a SEND to
  ``/queue/ActiveMQ.Statistics.Destination.<queue>`` with a ``reply-to`` is answered with a
  MapMessage, read as JSON (``transformation:jms-map-json``) on a connection of its own: a STOMP
  consumer can only receive a MapMessage through that translator, which needs XStream and
  Jettison on the broker's classpath, and a broker without them drops the connection.
"""

from __future__ import annotations

import contextlib
import json
import queue as queues
import time
import uuid
from collections.abc import Iterator, Sequence

from stomp.exception import StompException  # type: ignore[import-untyped]

from adapters.activemq_connection import Connection, Inbox, Listener, tls
from adapters.activemq_transport import StompConnection
from policies.errors import BrokerUnavailable

STATISTICS = "/queue/ActiveMQ.Statistics.Destination."
STATISTICS_REPLY = "/temp-queue/jms-bridge-statistics"
# The plugin ends its list of replies with an empty message when the request asks for it.
STATISTICS_END = "ActiveMQ.Statistics.Destination.List.End.With.Null"
# How long a statistics query waits for its replies unless its caller says: a local broker
# answers in milliseconds, but one busy with a full core of work took over half a second in CI.
STATISTICS_WAIT_S = 5.0


def map_message_json(body: bytes | str) -> dict[str, object]:
    """A MapMessage as ActiveMQ's ``jms-map-json`` writes it (XStream through Jettison):
    ``{"map": {"entry": [{"string": ["k", "v"]}, {"string": "size", "long": 3}, ...]}}`` --
    an entry whose two values have the same type is a list, otherwise one key per type, the
    name first; a single entry is not wrapped in a list. Empty map: ``{"map": ""}`` or ``{}``."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    if not text.strip():
        return {}
    data = json.loads(text)
    top = data.get("map") if isinstance(data, dict) else None
    entries = top.get("entry", []) if isinstance(top, dict) else []
    if isinstance(entries, dict):
        entries = [entries]
    out: dict[str, object] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        values = list(entry.values())
        if len(values) == 1 and isinstance(values[0], list) and len(values[0]) == 2:
            name, value = values[0]
        elif len(values) == 2:
            name, value = values
        else:
            continue
        out[str(name)] = value
    return out


def wildcard_scope(names: Sequence[str]) -> str | None:
    """The dotted segments every one of ``names`` starts with and goes on after, when there are
    such segments and no name holds a wildcard character: ``<scope>.>`` matches them all (and
    maybe others). None when one request per name is needed."""
    if len(names) < 2 or any("*" in n or ">" in n for n in names):
        return None
    split = [n.split(".") for n in names]
    common: list[str] = []
    for segments in zip(*(parts[:-1] for parts in split), strict=False):
        if len(set(segments)) != 1:
            break
        common.append(segments[0])
    return ".".join(common) if common and all(common) else None


class Statistics(Connection):
    """``depth``, ``consumers`` and ``depths`` of ``adapters.activemq.ActiveMQ``."""

    def depth(self, queue: str, *, wait_s: float | None = None) -> int:
        """The statistics plugin's ``size`` of ``queue`` (messages held by consumers counted);
        0 for a queue the broker does not have. One request and its replies on the statistics
        connection; BrokerUnavailable (and that connection closed) when there is no answer
        within ``wait_s`` (None: STATISTICS_WAIT_S)."""
        return self._sizes(queue, (queue,), wait_s=wait_s)[queue]

    def consumers(self, queue: str) -> int:
        """The statistics plugin's ``consumerCount`` of ``queue``."""
        return self._sizes(queue, (queue,), field="consumerCount")[queue]

    def depths(
        self, queues: Sequence[str], *, wait_s: float | None = None
    ) -> dict[str, int]:
        """One statistics request for queues whose names share leading dotted segments (the
        staging queues): the wildcard ``<those segments>.>`` is answered with one message per
        queue the broker has. A request per queue otherwise."""
        names = tuple(dict.fromkeys(queues))
        scope = wildcard_scope(names)
        if scope is None:
            return {name: self.depth(name, wait_s=wait_s) for name in names}
        return self._sizes(scope + ".>", names, wait_s=wait_s)

    def _sizes(
        self, expression: str, names: Sequence[str], *, field: str = "size",
        wait_s: float | None = None,
    ) -> dict[str, int]:
        """Ask ActiveMQ.Statistics.Destination.<expression> and read its replies to the end of
        the list, for at most ``wait_s`` (None: STATISTICS_WAIT_S): ``field`` of each of
        ``names`` answered for, 0 for the rest."""
        sizes = dict.fromkeys(names, 0)
        wait = STATISTICS_WAIT_S if wait_s is None else wait_s
        try:
            for name, values in self._statistics_rows(expression, wait):
                queue = name.removeprefix("queue://")
                if queue in sizes and field in values:
                    sizes[queue] = int(str(values[field]))
            return sizes
        except queues.Empty:
            self._close_statistics()
            raise BrokerUnavailable(
                f"{self._where()}: no answer from ActiveMQ.Statistics.Destination.{expression} "
                f"within {wait:g} s (is <statisticsBrokerPlugin/> configured, with XStream and "
                "Jettison for jms-map-json?)"
            ) from None
        except (StompException, OSError, ValueError) as exc:
            self._close_statistics()
            raise BrokerUnavailable(f"{self._where()}: statistics: {exc!r}") from exc

    def _statistics_rows(
        self, expression: str, timeout: float
    ) -> Iterator[tuple[str, dict[str, object]]]:
        """Ask ActiveMQ.Statistics.Destination.<expression> and yield (destination name, its
        values) for each reply up to the end of the list. queues.Empty when the replies stop
        for ``timeout`` s; StompException, OSError or ValueError as the connection or a reply
        fails (the callers say what they asked for)."""
        conn, inbox = self._statistics()
        with contextlib.suppress(queues.Empty):
            while True:  # leftovers of a request that timed out
                inbox.get_nowait()
        cid = f"jb-stats-{uuid.uuid4().hex}"
        expires = str(time.time_ns() // 1_000_000 + 60_000)
        conn.send(
            STATISTICS + expression, b"",
            headers={"reply-to": STATISTICS_REPLY, "correlation-id": cid,
                     STATISTICS_END: "true", "expires": expires},
        )
        deadline = time.monotonic() + timeout
        while True:
            frame = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            if frame is None:
                raise BrokerUnavailable(f"{self._where()}: statistics connection lost")
            if frame.headers.get("correlation-id", cid) != cid:
                continue
            values = map_message_json(frame.body)
            name = str(values.get("destinationName") or "")
            if not name:
                return  # the end of the list
            yield name, values

    def _statistics(self) -> tuple[StompConnection, Inbox]:
        """The statistics connection, opened on first use: a translator failure on the broker
        closes it, never the staging connection."""
        if self._stats is not None and self._stats[0].is_connected():
            return self._stats
        self._close_statistics()
        ep = self.endpoint
        inbox: Inbox = queues.Queue()
        listener = Listener()
        listener.routes["stats"] = inbox
        conn = StompConnection([(ep.host, ep.port)], heartbeats=(0, 0), auto_decode=False,
                            vhost=ep.vhost or "/", reconnect_attempts_max=1,
                            reconnect_sleep_initial=0.0)
        conn.set_listener("jms-bridge-stats", listener)
        tls(conn, ep)
        self._stats = (conn, inbox)
        try:
            conn.connect(ep.user, ep.password, wait=False)
            if not listener.await_connected(self._receipt_timeout):
                why = (listener.errors or [listener.lost or "no CONNECTED frame in time"])[0]
                raise BrokerUnavailable(f"{self._where()}: statistics: CONNECT refused: {why}")
            conn.subscribe(STATISTICS_REPLY, id="stats", ack="auto",
                           headers={"transformation": "jms-map-json", "receipt": "stats"})
            with listener.cv:
                ok = listener.cv.wait_for(lambda: "stats" in listener.receipts
                                          or listener.lost is not None, self._receipt_timeout)
            if not ok or listener.lost is not None:
                raise BrokerUnavailable(
                    f"{self._where()}: statistics: SUBSCRIBE with transformation:jms-map-json "
                    "not answered (a broker without XStream and Jettison drops the connection)"
                )
        except (StompException, OSError) as exc:
            self._close_statistics()
            raise BrokerUnavailable(f"{self._where()}: statistics: {exc!r}") from exc
        except BrokerUnavailable:
            self._close_statistics()
            raise
        return self._stats
