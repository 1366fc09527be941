"""Admin HTTP: liveness, readiness, Prometheus metrics, staged messages, dead letters
(``bridge.app.dlq_admin``).

The staged-message endpoints run the same code as ``jms-bridge staged``, each call on a
connection of its own in a worker thread (the adapters are blocking).

The console (``/console/``, ``bridge.app.webconsole``) is a page that calls these endpoints.

Who may call: with a token file (``--admin-token-file``), every endpoint but the probes and
/metrics wants ``Authorization: Bearer <token>`` (401 otherwise). Without one, the endpoints
that list or change staged messages are refused (403); /policy, which only shows
configuration, stays open.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict

from aiohttp import web

from adapters.base import StagingBroker
from adapters.queues import QueueTools
from bridge.app import dlq_admin, logs, webconsole
from bridge.app.auth import TokenFile
from bridge.app.metrics import Metrics
from bridge.app.policy_report import policy_report
from bridge.app.probes import probe, probe_amqp
from bridge.staging import listing, operations
from bridge.staging.envelope import Staged
from bridge.staging.levels import Layout
from bridge.staging.outcomes import Kind, MessageOutcome, Sink
from bridge.staging.staging_stats import StagingStats
from policies.endpoints import Endpoint
from policies.errors import BridgeError, ConfigError, Refused
from policies.redelivery import PolicyTable
from policies.selector import InvalidSelector, for_broker, parse
from policies.when import due_at, due_in

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Open to anyone who can reach the port: what probes and Prometheus scrape.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# Refused without a token file: they show or change messages.
PROTECTED = ("/staged", "/dlq")
WARNING_HEADER = "X-Jms-Bridge-Warning"  # on GET /staged: messages that may be missing
NO_TOKEN = ("the staged-message and dead-letter endpoints need an admin token: start the bridge "
            "with --admin-token-file FILE (or admin-token-file: in the config file, or "
            "JMS_BRIDGE_ADMIN_TOKEN_FILE), then send Authorization: Bearer <token>")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _yes(text: str | None) -> bool:
    return (text or "").lower() in ("1", "true", "yes")


def _selector(text: str | None, *, required: bool = False) -> str | None | web.Response:
    """The ``selector`` parameter, checked; a 400 naming the problem when it is bad."""
    if text is None or not text.strip():
        if required:
            return web.json_response({"error": "selector is required"}, status=400)
        return None
    try:
        parse(text)
    except InvalidSelector as error:
        return web.json_response({"error": f"selector: {error}"}, status=400)
    return text


def _due(request: web.Request) -> int | web.Response:
    """The new due time ``in=DURATION`` or ``at=TIME`` asks for; a 400 naming the problem."""
    given = {k: request.query[k] for k in ("in", "at") if request.query.get(k)}
    if len(given) != 1:
        return web.json_response({"error": "give one of in=DURATION (90s, 10m, 2h, 1d) or "
                                           "at=TIME (ISO 8601 or epoch ms)"}, status=400)
    now = time.time_ns() // 1_000_000
    try:
        if "in" in given:
            return due_in(given["in"], now)
        return due_at(given["at"], now)
    except ConfigError as error:
        return web.json_response({"error": str(error).replace("--", "", 1)}, status=400)


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
        recorders: Sequence[Sink] = (),
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
        # Where this process records what its staged endpoints did themselves while no staging
        # engine ran (the journal, the staged catalogue); a running engine records it otherwise.
        self.recorders = tuple(recorders)
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
                web.post("/staged/{message_id}/reschedule", self.staged_reschedule),
                web.post("/staged/cancel", self.staged_cancel_selected),
                web.post("/staged/release", self.staged_release_selected),
                web.post("/staged/reschedule", self.staged_reschedule_selected),
            ]
        )
        dlq_admin.install(self.app, queue_tools,
                          for_broker(broker),
                          prefix=self.layout.prefix, stats=metrics.deadletters)
        webconsole.install(self.app)
        self._runner: web.AppRunner | None = None

    @web.middleware
    async def _authorize(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS or webconsole.public(request.path):
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
        """``GET /staged[?target=D][&message_id=ID][&selector=EXPR][&scan=1][&count=1]``:
        the rows ``jms-bridge staged list`` prints (with ``count``, how many)."""
        target = request.query.get("target")
        message_id = request.query.get("message_id")
        scan = _yes(request.query.get("scan"))
        selector = _selector(request.query.get("selector"))
        if isinstance(selector, web.Response):
            return selector

        def work(broker: StagingBroker) -> web.Response:
            warnings: list[str] = []
            found = list(listing.rows(broker, self.layout, target=target, message_id=message_id,
                                    scan=scan, selector=selector, warnings=warnings))
            # A running engine that did not answer: what it holds is missing (said in a header,
            # the body keeps its shape).
            headers = {WARNING_HEADER: " | ".join(warnings)} if warnings else None
            if _yes(request.query.get("count")):
                return web.json_response({"count": len(found)}, headers=headers)
            return web.json_response([{**asdict(r), "due": r.due} for r in found],
                                     headers=headers)

        return await self._with_broker(work)

    async def staged_cancel_selected(self, request: web.Request) -> web.Response:
        """``POST /staged/cancel?selector=EXPR``: cancel every staged message it selects."""
        return await self._selected(request, "cancel")

    async def staged_release_selected(self, request: web.Request) -> web.Response:
        """``POST /staged/release?selector=EXPR``: release every staged message it selects."""
        return await self._selected(request, "release")

    async def staged_reschedule_selected(self, request: web.Request) -> web.Response:
        """``POST /staged/reschedule?selector=EXPR&in=DURATION`` (or ``&at=TIME``): move the
        due time of every staged message it selects."""
        return await self._selected(request, "reschedule")

    async def staged_reschedule(self, request: web.Request) -> web.Response:
        """``POST /staged/{id}/reschedule?in=DURATION`` (or ``?at=TIME``)."""
        message_id = request.match_info["message_id"]
        due_ms = _due(request)
        if isinstance(due_ms, web.Response):
            return due_ms

        def work(broker: StagingBroker) -> web.Response:
            try:
                outcome = operations.reschedule(broker, self.layout, message_id, due_ms)
            except operations.Busy as busy:
                return web.json_response({"error": str(busy)}, status=409)
            except Refused as refused:
                return web.json_response({"error": str(refused)}, status=409)
            return self._outcome(message_id, outcome)

        return await self._with_broker(work)

    async def _selected(self, request: web.Request, action: str) -> web.Response:
        selector = _selector(request.query.get("selector"), required=True)
        if isinstance(selector, web.Response):
            return selector
        scan = _yes(request.query.get("scan"))
        due_ms = _due(request) if action == "reschedule" else 0
        if isinstance(due_ms, web.Response):
            return due_ms

        def work(broker: StagingBroker) -> web.Response:
            found = list(listing.rows(broker, self.layout, selector=selector, scan=scan))
            done: list[str] = []
            failed: dict[str, str] = {}
            for row in found:
                try:
                    if action == "cancel":
                        outcome = operations.cancel(broker, self.layout, row.message_id, scan=scan)
                    elif action == "release":
                        outcome = operations.release_now(broker, self.layout, row.message_id)
                    else:
                        outcome = operations.reschedule(broker, self.layout, row.message_id, due_ms)
                except (operations.Busy, Refused) as error:
                    failed[row.message_id] = str(error)
                    continue
                if outcome is None:
                    failed[row.message_id] = operations.NOT_FOUND.format(row.message_id)
                    continue
                self._count(outcome)
                if outcome.as_asked:
                    done.append(row.message_id)
                else:
                    failed[row.message_id] = outcome.describe(row.message_id)
            verb = {"cancel": "cancelled", "release": "released",
                    "reschedule": "rescheduled"}[action]
            return web.json_response({"selected": len(found), verb: done, "failed": failed},
                                     status=200 if not failed else 409)

        return await self._with_broker(work)

    async def staged_cancel(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]

        def work(broker: StagingBroker) -> web.Response:
            try:
                outcome = operations.cancel(broker, self.layout, message_id)
            except operations.Busy as busy:
                return web.json_response({"error": str(busy)}, status=409)
            return self._outcome(message_id, outcome)

        return await self._with_broker(work)

    async def staged_release(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]

        def work(broker: StagingBroker) -> web.Response:
            try:
                outcome = operations.release_now(broker, self.layout, message_id)
            except operations.Busy as busy:
                return web.json_response({"error": str(busy)}, status=409)
            return self._outcome(message_id, outcome)

        return await self._with_broker(work)

    def _outcome(self, message_id: str, outcome: operations.OrderOutcome | None) -> web.Response:
        """200 with what was done; 404 when nothing had the message; 409 when the engine
        that held it could not do as asked (its time to live was up, its target refused it).
        Counted here when this process did it; an engine counts what it does."""
        if outcome is None:
            return web.json_response({"error": operations.NOT_FOUND.format(message_id)}, status=404)
        self._count(outcome)
        if not outcome.as_asked:
            return web.json_response({"error": outcome.describe(message_id)}, status=409)
        if outcome.due_ms is not None:  # a staged cancel (dropped then), or a reschedule
            return web.json_response({outcome.done: message_id, "due_ms": outcome.due_ms})
        return web.json_response({outcome.done: message_id})

    def _count(self, outcome: operations.OrderOutcome) -> None:
        """What this process did itself, counted and recorded here unless a running engine
        took the note of it (it counts and records it then: once either way)."""
        if outcome.by_engine or outcome.noted:
            return
        stats = self.staging_stats
        if stats is not None:
            if outcome.done == "cancelled":
                stats.tools_cancelled += 1
            elif outcome.done == "released":
                stats.tools_released += 1
        if self.recorders and outcome.staged is not None:
            kind = {"cancelled": Kind.CANCELLED, "released": Kind.RELEASED_NOW,
                    "rescheduled": Kind.RESCHEDULED}.get(outcome.done)
            try:
                info = Staged.of(outcome.staged.headers)
            except (KeyError, ValueError):
                return
            if kind is None:
                return
            due = outcome.due_ms if kind is Kind.RESCHEDULED else info.due_ms
            recorded = MessageOutcome(
                kind, time.time_ns() // 1_000_000, info.message_id, info.target, due,
                info.expires_ms, size=len(outcome.staged.body),
                detail=f"was due at {info.due_ms}" if kind is Kind.RESCHEDULED else "",
                headers=outcome.staged.headers if kind is Kind.RESCHEDULED else None)
            for sink in self.recorders:
                sink([recorded])

    async def start(self, where: Endpoint) -> None:
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, where.host, where.port, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
