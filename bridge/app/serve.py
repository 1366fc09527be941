"""``jms-bridge run``: the STOMP front-end and the admin endpoints in one asyncio process, and
the staging engine in a process of its own (``bridge.app.engine_process``)."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import ssl
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from adapters.base import PutCheck, StagedFormat
from bridge.app import dlq, logs
from bridge.app.auth import TokenFile
from bridge.app.brokers import broker_as, staged_format, staging_broker
from bridge.app.config import Settings, bridge_amqp
from bridge.app.engine_process import EngineProcess
from bridge.app.journal import Journal
from bridge.app.metrics import Metrics, WriterCollector
from bridge.app.policy_report import pattern_warnings
from bridge.app.queue_policies import QueuePolicies, from_management
from bridge.app.resources import needed, raise_open_files, return_freed_memory
from bridge.app.tls import CertFiles, client_context, server_context
from bridge.app.upstream import BrokerWatch
from bridge.intercept.chain import Chain
from bridge.intercept.delay import DelayInterceptor
from bridge.intercept.expiry import ExpiryStamp
from bridge.intercept.guard import StagingGuard
from bridge.intercept.redelivery import RedeliveryInterceptor
from bridge.staging.catalogue import CatalogueSink, CatalogueWriter, new_counters
from bridge.staging.levels import Layout, layout_for
from bridge.staging.outcomes import FailureTally, LogSink, Sink, StatsSink
from bridge.staging.staging_stats import StagingStats, shared_slots
from bridge.staging.targets import TargetChecks, TargetKey
from policies.delay import DelayConfig
from policies.endpoints import Endpoint
from policies.errors import ConfigError
from policies.scheduler import DELAY as SCHEDULED_DELAY


async def _listen(what: str, where: Endpoint, start: object) -> None:
    try:
        await start  # type: ignore[misc]
    except OSError as exc:
        raise ConfigError(f"{what}: cannot listen on {where}: {exc.strerror or exc}") from None


def _check_free(settings: Settings) -> None:
    """ConfigError for a listening address already taken, found before the engine's process
    starts (the listeners themselves are set up after it, and say the same if one is taken
    meanwhile)."""
    wanted = [("--stomp-listen", settings.stomp_listen), ("--admin-listen", settings.admin_listen),
              ("--stomp-tls-listen", settings.stomp_tls_listen),
              ("--amqp-listen", settings.amqp_listen),
              ("--amqp-tls-listen", settings.amqp_tls_listen)]
    for what, where in wanted:
        if where is None or not where.port:
            continue
        try:
            socket.create_server((where.host, where.port)).close()
        except OSError as exc:
            raise ConfigError(f"{what}: cannot listen on {where}: {exc.strerror or exc}") from None


def _prepare_staging(settings: Settings, layout: Layout) -> None:
    """Declare the staging queues (clients send to them by name) with the bridge's own
    connection; BrokerUnavailable when the broker cannot be reached that way. Run by the
    BrokerWatch, at start or whenever the broker first answers."""
    broker = staging_broker(settings)
    broker.connect()
    try:
        broker.ensure_queues(layout.queues)
    finally:
        broker.close()


def target_checks(settings: Settings) -> TargetChecks:
    """Checks of a delayed send's target, asked of the broker as the sending client."""

    def probe(key: TargetKey) -> PutCheck:
        broker = broker_as(settings, key.login, key.passcode, key.vhost)
        broker.connect()
        try:
            return broker.check_put(key.destination)
        finally:
            broker.close()

    own = staging_broker(settings)  # never connected: only asked what the staging send covers
    return TargetChecks(probe, needs_probe=lambda destination: not own.staging_checks(destination))


def queue_policies(settings: Settings) -> QueuePolicies | None:
    """Where the policies queues declare in their arguments are read: RabbitMQ's management
    API, when the bridge has it (ActiveMQ queues have no arguments)."""
    if settings.broker != "rabbitmq" or settings.upstream_management is None:
        return None
    return from_management(settings.upstream_management, bridge_amqp(settings).vhost)


def delay_config(settings: Settings) -> DelayConfig:
    relative = settings.delay_headers
    if settings.activemq_scheduler == "passthrough":  # the broker's scheduler takes its own
        relative = tuple(h for h in relative if h != SCHEDULED_DELAY)
    return DelayConfig(
        relative_headers=relative,
        absolute_headers=settings.delivery_time_headers,
        disabled_destinations=settings.delay_disabled,
        staging_prefix=settings.staging_prefix,
        broker=settings.broker,
    )


def tls_listener(settings: Settings) -> CertFiles | None:
    """The TLS listeners' context (one for both) and certificate files, or None without one."""
    if (settings.stomp_tls_listen is None and settings.amqp_tls_listen is None) \
            or not settings.tls_cert or not settings.tls_key:
        return None
    ctx = server_context(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
    return CertFiles(ctx, settings.tls_cert, settings.tls_key)


def _quiet_tls_failures(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    """A client that fails the TLS handshake (plain text on the TLS port, an unknown CA, TLS
    1.1) is closed by asyncio; say so in one line instead of a traceback."""
    exc = context.get("exception")
    if isinstance(exc, ssl.SSLError | ConnectionResetError | TimeoutError):
        logs.get("tls").info("TLS handshake failed; connection closed", error=str(exc))
        return
    loop.default_exception_handler(context)


def _say_open_files(settings: Settings, log: FilteringBoundLogger, soft: int, hard: int) -> None:
    """The open-file limit (raised as far as allowed), against what the connection limit may
    take."""
    want = needed(settings.max_connections)
    if 0 <= soft < want:
        log.warning("open-file limit lower than --max-connections needs", open_files=soft,
                    hard_limit=hard, needed=want,
                    hint="raise the hard limit (ulimit -Hn, LimitNOFILE=) or lower "
                         "--max-connections")
    else:
        log.info("open-file limit", open_files=soft, hard_limit=hard, needed=want)


async def serve(settings: Settings, *, ready: asyncio.Event | None = None) -> None:
    log = logs.get("bridge")
    loop = asyncio.get_running_loop()
    tokens = TokenFile(settings.admin_token_file) if settings.admin_token_file else None
    tls_files = tls_listener(settings)  # a bad certificate or key ends the bridge here
    upstream_ssl = client_context(settings.upstream_ca) if settings.upstream_stomp.tls else None
    config = delay_config(settings)
    for warning in pattern_warnings(settings):  # a typo in a pattern's form: said once, here
        log.warning(warning)
    fmt = staged_format(settings)
    layout = layout_for(fmt, settings.staging_prefix)
    watch = BrokerWatch(settings.broker, settings.upstream_stomp,
                        lambda: _prepare_staging(settings, layout))
    if settings.upstream_wait is not None:  # the fail-fast start, asked for: one line
        await watch.wait(settings.upstream_wait, quiet=True)
    soft_files = raise_open_files()  # before the listeners: said once they are up
    return_freed_memory()
    metrics = Metrics()
    staging = StagingStats(slots=shared_slots()) if settings.staging_engine else StagingStats()
    staging.register(metrics.registry)
    targets = target_checks(settings)
    journal = Journal.open(settings, metrics.registry)
    catalogue: CatalogueWriter | None = None
    engine_catalogue: MutableSequence[int] | None = None
    if settings.staged_catalogue:  # one writer in each process, the same file
        catalogue = CatalogueWriter(settings.staged_catalogue, new_counters()).start()
        engine_catalogue = new_counters()
        metrics.registry.register(WriterCollector(
            "jms_bridge_catalogue", "Rows of the staged catalogue added or taken out.",
            "Changes to the staged catalogue dropped: its writer's queue was full or SQLite "
            "refused them (the messages are still staged; staged list --scan finds them).",
            catalogue.counters, engine_catalogue))
    # Where the delay and redelivery interceptors' outcomes are recorded: the journal, the
    # staged catalogue (the engine's process records its own).
    recorders: list[Sink] = [*(journal.sinks if journal is not None else []),
                             *([CatalogueSink(catalogue)] if catalogue is not None else [])]
    _check_free(settings)
    # The engine's process starts first: it imports and connects while the front-ends and the
    # admin API are imported and set up (started after them, a restarted bridge's first
    # release came 1.1-2.1 s after its start).
    engine = EngineProcess(
        settings, layout, staging,
        journal=(journal.spec, journal.engine_counters) if journal is not None else None,
        catalogue_counters=engine_catalogue,
        catalogue_feed=catalogue.counters if catalogue is not None else None,
    ) if settings.staging_engine else None
    if engine is not None:
        staging.pending = lambda: staging.pending_count
        engine.start()
    try:
        await _serve(settings, log, loop, ready, _Started(
            engine, staging, metrics, recorders, layout, watch, soft_files, tokens, tls_files,
            upstream_ssl, config, fmt, targets))
    finally:
        if engine is not None:
            await engine.close()
        if journal is not None:
            journal.close()
        if catalogue is not None:
            catalogue.close()


@dataclass(frozen=True, slots=True)
class _Started:
    """What ``serve`` has set up before the front-ends."""

    engine: EngineProcess | None
    staging: StagingStats
    metrics: Metrics
    recorders: Sequence[Sink]  # the journal's and the staged catalogue's sinks
    layout: Layout
    watch: BrokerWatch
    soft_files: tuple[int, int]
    tokens: TokenFile | None
    tls_files: CertFiles | None
    upstream_ssl: ssl.SSLContext | None
    config: DelayConfig
    fmt: StagedFormat
    targets: TargetChecks


async def _serve(settings: Settings, log: FilteringBoundLogger,
                 loop: asyncio.AbstractEventLoop, ready: asyncio.Event | None,
                 started: _Started) -> None:
    """The front-ends and the admin API, until SIGTERM or SIGINT; imported here, once the
    engine's process has started."""
    from bridge.app.admin import Admin
    from bridge.app.scheduler_admin import SchedulerAdmin
    from bridge.frontends.amqp.server import AmqpRelay
    from bridge.frontends.stomp import Limits
    from bridge.frontends.stomp.server import StompServer
    from bridge.intercept.scheduler import ManagementInterceptor

    engine, staging, metrics, recorders = (started.engine, started.staging, started.metrics,
                                           started.recorders)
    layout, watch, soft_files = started.layout, started.watch, started.soft_files
    tokens, tls_files, upstream_ssl = started.tokens, started.tls_files, started.upstream_ssl
    config, fmt, targets = started.config, started.fmt, started.targets
    guard = StagingGuard(layout)
    delay = DelayInterceptor(fmt=fmt, config=config, layout=layout,
                             sinks=[StatsSink(staging), *recorders], targets=targets,
                             scheduler=settings.activemq_scheduler == "take")
    scheduling = [ManagementInterceptor(SchedulerAdmin(settings, layout))] if (
        settings.activemq_scheduler == "take") else []
    chain = Chain([
        guard,
        *scheduling,
        delay,
        RedeliveryInterceptor(
            table=settings.redelivery, fmt=fmt, layout=layout,
            undelivered=f"/queue/{settings.undelivered_queue}",
            sinks=[FailureTally(metrics.relay.redeliveries, metrics.relay.dead_letters),
                   LogSink(logs.get("redelivery")), *recorders],
            count_first=settings.first_delivery_count,
            queue_policies=queue_policies(settings),
        ),
        ExpiryStamp(),  # last: a delayed send's staged copy carries its expiry itself
    ])
    stomp = StompServer(
        broker=settings.broker,
        upstream=settings.upstream_stomp,
        chain=chain,
        stats=metrics.relay,
        handshake_timeout=settings.handshake_timeout,
        max_connections=settings.max_connections,
        max_per_address=settings.max_connections_per_address,
        limits=Limits(max_frame_bytes=settings.max_frame_bytes),
        max_buffered_bytes=settings.max_buffered_bytes,
        upstream_ssl=upstream_ssl,
        settled=watch.settled,
    )
    # The AMQP listener's upstream: each client's own connection goes to the first of its nodes
    # that answers, over TLS for amqps:// (verified as the bridge's own connections are); the
    # same for /readyz's check of it.
    amqp_on = settings.amqp_listen is not None or settings.amqp_tls_listen is not None
    upstream_amqp = bridge_amqp(settings) if amqp_on else None
    amqp_ssl = (client_context(upstream_amqp.ca_file)
                if upstream_amqp is not None and upstream_amqp.tls else None)
    admin = Admin(
        metrics=metrics,
        broker=settings.broker,
        upstream=settings.upstream_stomp,
        staging=lambda: staging_broker(settings),
        layout=layout,
        staging_stats=staging,
        redelivery=settings.redelivery,
        tokens=tokens,
        readiness=watch.readiness,
        queue_tools=lambda: dlq.queue_tools(settings),
        upstream_amqp=upstream_amqp,
        upstream_amqp_ssl=amqp_ssl,
        recorders=recorders,
    )
    await _listen("--stomp-listen", settings.stomp_listen, stomp.listen(settings.stomp_listen))
    await _listen("--admin-listen", settings.admin_listen, admin.start(settings.admin_listen))
    reloading: asyncio.Task[None] | None = None
    if tls_files is not None:
        if settings.stomp_tls_listen is not None:
            await _listen("--stomp-tls-listen", settings.stomp_tls_listen,
                          stomp.listen_tls(settings.stomp_tls_listen, tls_files.ctx))
        reloading = asyncio.create_task(tls_files.watch())
        loop.set_exception_handler(_quiet_tls_failures)
    amqp: AmqpRelay | None = None
    if upstream_amqp is not None:
        # The same interceptors, on the same views, for publishes and consumers alike.
        # Shared with the STOMP side: the frame limit (as the largest body), the connection
        # limits (counted per listener), the handshake timeout (for the protocol header), the
        # buffered-bytes budget (one for both listeners) and the broker-away answer (a
        # Connection.Close).
        nodes = upstream_amqp.every()
        amqp = AmqpRelay(upstream_amqp.host, upstream_amqp.port, chain=chain,
                         alternates=[(node.host, node.port) for node in nodes[1:]],
                         upstream_ssl=amqp_ssl,
                         stats=metrics.count_amqp(),
                         max_body_size=settings.max_frame_bytes,
                         max_connections=settings.max_connections,
                         max_per_address=settings.max_connections_per_address,
                         settled=watch.settled,
                         handshake_timeout=settings.handshake_timeout,
                         budget=stomp.budget)
        where = settings.amqp_listen
        if where is not None:
            await _listen("--amqp-listen", where, amqp.listen(where.host, where.port))
        where = settings.amqp_tls_listen
        if where is not None and tls_files is not None:  # (the same certificate, reloaded)
            await _listen("--amqp-tls-listen", where,
                          amqp.listen_tls(where.host, where.port, tls_files.ctx))

    watching: asyncio.Task[None] | None = None
    if engine is not None:
        watching = asyncio.create_task(engine.watch())
    _say_open_files(settings, log, *soft_files)
    waiting = None if watch.prepared else asyncio.create_task(watch.wait())
    stop = asyncio.Event()
    fatal: list[BaseException] = []
    if waiting is not None:  # staging queues of another type: end naming them (see upstream)
        waiting.add_done_callback(lambda task: _fatal(task, fatal, stop))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # What start-up made lives as long as the process: out of the cyclic collector's sight,
    # its full collections walk only what the traffic makes (what that saves on AMQP publishes:
    # docs/benchmarks.md, "Measurements behind design choices").
    gc.freeze()
    log.info(
        "listening",
        broker=settings.broker,
        stomp=str(settings.stomp_listen),
        stomp_tls=str(settings.stomp_tls_listen) if settings.stomp_tls_listen else "off",
        amqp=str(settings.amqp_listen) if settings.amqp_listen else "off",
        amqp_tls=str(settings.amqp_tls_listen) if settings.amqp_tls_listen else "off",
        admin=str(settings.admin_listen),
        admin_token="file" if tokens is not None else "none: /staged refused",
        upstream=str(settings.upstream_stomp),
        broker_ready=watch.prepared,
    )
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("shutting down", open=len(stomp.links))
    for task in (waiting, reloading):
        if task is not None:
            task.cancel()
    await stomp.shutdown()
    if amqp is not None:
        await amqp.close()
    if watching is not None:
        watching.cancel()
    await admin.stop()
    if fatal:
        raise fatal[0]
    log.info("stopped")


def _fatal(task: asyncio.Task[None], fatal: list[BaseException], stop: asyncio.Event) -> None:
    """The broker watch ended with an error that waiting cannot mend: stop the bridge with it."""
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    assert error is not None
    fatal.append(error)
    stop.set()
