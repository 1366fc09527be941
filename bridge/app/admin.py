"""Admin HTTP: liveness, readiness, Prometheus metrics, staged messages, dead letters
(``bridge.app.dlq_admin``).

The staged-message endpoints run the same code as ``jms-bridge staged``, each call on a
connection of its own in a worker thread (the adapters are blocking).

Who may call: with a token file (``--admin-token-file``), every endpoint but the probes and
/metrics wants ``Authorization: Bearer <token>`` (401 otherwise). Without one, the endpoints
that list or change staged messages are refused (403); /policy, which only shows
configuration, stays open.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict

from aiohttp import web

from adapters.base import StagingBroker
from adapters.queues import QueueTools
from bridge.app import dlq_admin, logs
from bridge.app.auth import TokenFile
from bridge.app.metrics import Metrics
from bridge.app.policies import policy_report
from bridge.app.probes import probe, probe_amqp
from bridge.staging import tools
from bridge.staging.levels import Layout
from bridge.staging.stats import StagingStats
from policies.endpoints import Endpoint
from policies.errors import BridgeError, ConfigError
from policies.redelivery import PolicyTable
from policies.selector import ACTIVEMQ, RABBITMQ

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Open to anyone who can reach the port: what probes and Prometheus scrape.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Refused without a token file: they show or change messages.
PROTECTED = ("/staged", "/dlq")
NO_TOKEN = ("the staged-message and dead-letter endpoints need an admin token: start the bridge "
            "with --admin-token-file FILE (or admin-token-file: in the config file, or "
            "JMS_BRIDGE_ADMIN_TOKEN_FILE), then send Authorization: Bearer <token>")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _unauthorized(why: str, challenge: str) -> web.Response:
    return web.json_response({"error": why}, status=401,
                             headers={"WWW-Authenticate": challenge})


class Admin:
    def __init__(
        self,
        *,
        metrics: Metrics,
        broker: str,
        upstream: Endpoint,
        staging: Callable[[], StagingBroker] | None = None,
        layout: Layout | None = None,
        staging_stats: StagingStats | None = None,
        redelivery: PolicyTable | None = None,
        tokens: TokenFile | None = None,
        readiness: Callable[[], str | None] | None = None,
        queue_tools: Callable[[], QueueTools] | None = None,
        upstream_amqp: Endpoint | None = None,
        upstream_amqp_ssl: ssl.SSLContext | None = None,
    ) -> None:
        self.metrics = metrics
        self.upstream_amqp = upstream_amqp  # checked by /readyz when the AMQP listener is on
        self.upstream_amqp_ssl = upstream_amqp_ssl  # (amqps://)
        self.broker = broker
        self.upstream = upstream
        self.staging = staging
        self.layout = layout or Layout()
        self.staging_stats = staging_stats
        self.redelivery = redelivery if redelivery is not None else PolicyTable()
        self.tokens = tokens
        # Why the bridge is not ready yet (the broker not yet set up), None once it is.
        self.readiness = readiness or (lambda: None)
        self.started = time.time()
        self.app = web.Application(middlewares=[self._authorize])
        self.app.add_routes(
            [
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
                web.get("/metrics", self.prometheus),
                web.get("/staged", self.staged_list),
                web.get("/policy", self.policy),
                web.post("/staged/{message_id}/cancel", self.staged_cancel),
                web.post("/staged/{message_id}/release", self.staged_release),
            ]
        )
        dlq_admin.install(self.app, queue_tools,
                          RABBITMQ if broker == "rabbitmq" else ACTIVEMQ,
                          prefix=self.layout.prefix, stats=metrics.deadletters)
        self._runner: web.AppRunner | None = None

    @web.middleware
    async def _authorize(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS:
            return await handler(request)
        tokens = self.tokens
        if tokens is None:
            if request.path.startswith(PROTECTED):
                return web.json_response({"error": NO_TOKEN}, status=403)
            return await handler(request)
        before = (tokens.problem, tokens.reloads)
        tokens.refresh()
        if tokens.problem is not None and tokens.problem != before[0]:
            logs.get("admin").error("admin token file unusable: every caller is refused",
                                    problem=tokens.problem)
        elif tokens.reloads != before[1]:
            logs.get("admin").info("admin token file read again", path=tokens.path)
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return _unauthorized("an admin token is required: Authorization: Bearer <token>",
                                 'Bearer realm="jms-bridge"')
        if not tokens.accepts(presented.strip()):
            return _unauthorized("the admin token is not valid",
                                 'Bearer realm="jms-bridge", error="invalid_token"')
        return await handler(request)

    async def policy(self, request: web.Request) -> web.Response:
        """``GET /policy?destination=D[&user=U][&upto=N]``: what ``jms-bridge policy show``
        prints, as JSON."""
        destination = request.query.get("destination")
        upto = request.query.get("upto")
        if not destination:
            return web.json_response({"error": "destination is required"}, status=400)
        if upto is not None and not (upto.isascii() and upto.isdigit() and 1 <= int(upto) <= 1000):
            return web.json_response({"error": "upto: expected 1 to 1000"}, status=400)
        try:
            report = policy_report(self.redelivery, destination, user=request.query.get("user"),
                                   upto=int(upto) if upto else None)
        except ConfigError as error:  # a form the broker does not take
            return web.json_response({"error": str(error)}, status=400)
        return web.json_response(report)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "uptime_s": round(time.time() - self.started, 1)})

    async def readyz(self, request: web.Request) -> web.Response:
        problem = self.readiness() or await probe(self.upstream)
        body = {"broker": self.broker, "upstream": str(self.upstream)}
        if self.upstream_amqp is not None:
            body["upstream_amqp"] = str(self.upstream_amqp)
            amqp_problem = await probe_amqp(self.upstream_amqp, tls=self.upstream_amqp_ssl)
            if amqp_problem is not None:
                problem = "; ".join(p for p in (problem, f"AMQP: {amqp_problem}") if p)
        if problem is None:
            return web.json_response({"status": "ready", **body})
        return web.json_response({"status": "not ready", "problem": problem, **body}, status=503)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics.render(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE}
        )

    async def _with_broker(self, work: Callable[[StagingBroker], web.Response]) -> web.Response:
        if self.staging is None:
            return web.json_response({"error": "no staging broker configured"}, status=503)
        open_broker = self.staging

        def run() -> web.Response:
            broker = open_broker()
            broker.connect()
            try:
                return work(broker)
            finally:
                broker.close()

        try:
            return await asyncio.get_running_loop().run_in_executor(None, run)
        except BridgeError as exc:
            return web.json_response({"error": str(exc)}, status=503)

    async def staged_list(self, request: web.Request) -> web.Response:
        target = request.query.get("target")
        message_id = request.query.get("message_id")
        scan = request.query.get("scan", "").lower() in ("1", "true", "yes")

        def work(broker: StagingBroker) -> web.Response:
            found = tools.rows(broker, self.layout, target=target, message_id=message_id,
                               scan=scan)
            return web.json_response([{**asdict(r), "due": r.due} for r in found])

        return await self._with_broker(work)

    async def staged_cancel(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]

        def work(broker: StagingBroker) -> web.Response:
            try:
                outcome = tools.cancel(broker, self.layout, message_id)
            except tools.Busy as busy:
                return web.json_response({"error": str(busy)}, status=409)
            return self._outcome(message_id, outcome)

        return await self._with_broker(work)

    async def staged_release(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]

        def work(broker: StagingBroker) -> web.Response:
            try:
                outcome = tools.release_now(broker, self.layout, message_id)
            except tools.Busy as busy:
                return web.json_response({"error": str(busy)}, status=409)
            return self._outcome(message_id, outcome)

        return await self._with_broker(work)

    def _outcome(self, message_id: str, outcome: tools.Outcome | None) -> web.Response:
        """200 with what was done; 404 when nothing had the message; 409 when the engine
        that held it could not do as asked (its time to live was up, its target refused it).
        Counted here when this process did it; an engine counts what it does."""
        if outcome is None:
            return web.json_response({"error": tools.NOT_FOUND.format(message_id)}, status=404)
        stats = self.staging_stats
        if stats is not None and not outcome.by_engine:
            if outcome.done == "cancelled":
                stats.tools_cancelled += 1
            else:
                stats.tools_released += 1
        if not outcome.as_asked:
            return web.json_response({"error": outcome.describe(message_id)}, status=409)
        if outcome.due_ms is not None:  # a staged cancel: dropped when it comes due
            return web.json_response({outcome.done: message_id, "due_ms": outcome.due_ms})
        return web.json_response({outcome.done: message_id})

    async def start(self, where: Endpoint) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, where.host, where.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
