"""The dead-letter tools on the admin HTTP API: the same operations as ``jms-bridge dlq``,
token-protected like ``/staged`` (refused with 403 when the bridge has no token file).

    GET  /dlq                                   candidate dead-letter queues and their counts:
                                                {"queues": [{"queue", "messages"}],
                                                 "incomplete": null or why only the queues
                                                 known by name are there}
    GET  /dlq/{queue}/count?selector=           how many match
    GET  /dlq/{queue}/messages?selector=&limit=&body=true   metadata (and bodies)
    GET  /dlq/{queue}/summary?selector=         how many match, by reason and by original
                                                destination
    POST /dlq/{queue}/purge?selector=&limit=&all=true
    POST /dlq/{queue}/replay?selector=&limit=&to=
    POST /dlq/{queue}/move?to=&selector=&limit=

Answers: 200 with JSON; 400 for a bad selector or parameter (the one-line error); 404 for a
queue the broker does not have; 409 when a put was refused part-way (the body says what was
done and why it stopped, with the MQRC reason); 503 when the broker cannot be reached.
Each call runs on a connection of its own in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from aiohttp import web

from adapters.queues import QueueTools
from bridge.deadletter import ops
from bridge.deadletter.deadletter_stats import DeadLetterStats
from policies.errors import BridgeError, ConfigError
from policies.naming import queue_name
from policies.selector import HeaderMap

PATHS = ("/dlq",)
UNKNOWN = "(unknown)"  # a dead letter that does not say why, or where it was going


class DeadLetterRoutes:
    def __init__(
        self, open_tools: Callable[[], QueueTools], header_map: HeaderMap, *, prefix: str,
        stats: DeadLetterStats,
    ) -> None:
        self.open_tools = open_tools
        self.header_map = header_map
        self.prefix = prefix
        self.stats = stats

    def install(self, app: web.Application) -> None:
        app.add_routes([
            web.get("/dlq", self.listing),
            web.get("/dlq/{queue}/count", self.count),
            web.get("/dlq/{queue}/messages", self.messages),
            web.get("/dlq/{queue}/summary", self.summary),
            web.post("/dlq/{queue}/{operation:purge|replay|move}", self.change),
        ])

    async def _run(self, work: Callable[[QueueTools], web.Response]) -> web.Response:
        open_tools = self.open_tools

        def run() -> web.Response:
            tools = open_tools()
            tools.connect()
            try:
                return work(tools)
            finally:
                tools.close()

        try:
            return await asyncio.get_running_loop().run_in_executor(None, run)
        except ConfigError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except BridgeError as exc:
            return web.json_response({"error": str(exc)}, status=503)

    def _picker(self, request: web.Request) -> ops.Picker:
        return ops.Picker.of(request.query.get("selector"), self.header_map)

    @staticmethod
    def _limit(request: web.Request) -> int | None:
        text = request.query.get("limit")
        if text is None:
            return None
        if not (text.isascii() and text.isdigit()) or int(text) < 1:
            raise ConfigError(f"limit: expected a whole number of at least 1, got {text!r}")
        return int(text)

    async def listing(self, request: web.Request) -> web.Response:
        def work(tools: QueueTools) -> web.Response:
            return web.json_response(ops.candidates(tools, prefix=self.prefix).as_dict())

        return await self._run(work)

    async def count(self, request: web.Request) -> web.Response:
        given = request.match_info["queue"]

        def work(tools: QueueTools) -> web.Response:
            queue = queue_name(given, tools.name)  # /queue/X, /amq/queue/X or X
            picker = self._picker(request)
            if tools.size(queue) is None:
                return _no_queue(queue)
            return web.json_response({"queue": queue, "count": ops.count(tools, queue, picker)})

        return await self._run(work)

    async def messages(self, request: web.Request) -> web.Response:
        given = request.match_info["queue"]
        body = request.query.get("body", "").lower() in ("1", "true", "yes")

        def work(tools: QueueTools) -> web.Response:
            queue = queue_name(given, tools.name)  # /queue/X, /amq/queue/X or X
            picker, limit = self._picker(request), self._limit(request)
            if tools.size(queue) is None:
                return _no_queue(queue)
            entries = ops.browse(tools, queue, picker, limit=limit)
            return web.json_response([e.as_dict(body=body) for e in entries])

        return await self._run(work)

    async def summary(self, request: web.Request) -> web.Response:
        queue = request.match_info["queue"]

        def work(tools: QueueTools) -> web.Response:
            picker = self._picker(request)
            if tools.size(queue) is None:
                return _no_queue(queue)
            reasons: Counter[str] = Counter()
            destinations: Counter[str] = Counter()
            for entry in ops.browse(tools, queue, picker, limit=None):
                reasons[entry.info.reason or UNKNOWN] += 1
                destinations[entry.info.original_destination or UNKNOWN] += 1
            return web.json_response({
                "queue": queue, "count": reasons.total(),
                "by_reason": dict(reasons.most_common()),
                "by_destination": dict(destinations.most_common())})

        return await self._run(work)

    async def change(self, request: web.Request) -> web.Response:
        given = request.match_info["queue"]
        operation = request.match_info["operation"]
        to = request.query.get("to") or None
        if to is not None and not to.startswith("/"):
            to = f"/queue/{to}"

        def work(tools: QueueTools) -> web.Response:
            queue = queue_name(given, tools.name)  # /queue/X, /amq/queue/X or X
            picker, limit = self._picker(request), self._limit(request)
            if operation == "purge" and picker.selector is None and (
                    request.query.get("all", "").lower() not in ("1", "true", "yes")):
                raise ConfigError("purge without a selector removes every message: add all=true")
            if tools.size(queue) is None:
                return _no_queue(queue)
            fmt = tools.format  # type: ignore[attr-defined]
            outcome = ops.change(tools, operation, queue, picker, fmt, limit=limit, to=to,
                                 stats=self.stats)
            status = 200 if outcome.error is None else 409
            return web.json_response(outcome.as_dict(), status=status)

        return await self._run(work)


def _no_queue(queue: str) -> web.Response:
    return web.json_response({"error": f"no queue {queue!r} on the broker"}, status=404)


def install(app: web.Application, open_tools: Callable[[], QueueTools] | None,
            header_map: HeaderMap, *, prefix: str, stats: DeadLetterStats) -> None:
    if open_tools is None:
        return
    DeadLetterRoutes(open_tools, header_map, prefix=prefix, stats=stats).install(app)
