"""``jms-bridge run``: the STOMP front-end and the admin endpoints in one asyncio process, and
the staging engine in a process of its own (``bridge.app.engine_process``)."""

from __future__ import annotations

import asyncio
import signal

from tenacity import AsyncRetrying, retry_if_result, stop_after_delay, wait_fixed

from adapters.base import PutCheck
from bridge.app import logs
from bridge.app.admin import Admin, probe
from bridge.app.auth import TokenFile
from bridge.app.brokers import broker_as, staged_format, staging_broker
from bridge.app.config import Settings, bridge_amqp
from bridge.app.engine_process import EngineProcess
from bridge.app.journal import Journal
from bridge.app.metrics import Metrics
from bridge.frontends.amqp.server import AmqpRelay
from bridge.frontends.stomp.server import StompServer
from bridge.intercept.chain import Chain
from bridge.intercept.delay import DelayInterceptor
from bridge.intercept.guard import StagingGuard
from bridge.intercept.redelivery import RedeliveryInterceptor
from bridge.staging.levels import Layout, layout_for
from bridge.staging.outcomes import FailureTally, LogSink, StatsSink
from bridge.staging.stats import StagingStats, shared_slots
from bridge.staging.targets import TargetChecks, TargetKey
from policies.delay import DelayConfig
from policies.endpoints import Endpoint
from policies.errors import BrokerUnavailable, ConfigError


async def wait_for_broker(name: str, target: Endpoint, patience: float = 3.0) -> None:
    """Give a broker that is just starting a moment; then say plainly that it is not there."""
    retrying = AsyncRetrying(
        stop=stop_after_delay(patience),
        wait=wait_fixed(0.5),
        retry=retry_if_result(lambda problem: problem is not None),
        retry_error_callback=lambda state: state.outcome.result() if state.outcome else "?",
    )
    problem: str | None = await retrying(probe, target)
    if problem is not None:
        raise BrokerUnavailable(f"{name} STOMP at {target} is not reachable: {problem}")


async def _listen(what: str, where: Endpoint, start: object) -> None:
    try:
        await start  # type: ignore[misc]
    except OSError as exc:
        raise ConfigError(f"{what}: cannot listen on {where}: {exc.strerror or exc}") from None


def _prepare_staging(settings: Settings, layout: Layout) -> None:
    """Declare the staging queues (clients send to them by name) with the bridge's own
    connection; BrokerUnavailable when the broker cannot be reached that way."""
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


def delay_config(settings: Settings) -> DelayConfig:
    return DelayConfig(
        relative_headers=settings.delay_headers,
        absolute_headers=settings.delivery_time_headers,
        disabled_destinations=settings.delay_disabled,
        staging_prefix=settings.staging_prefix,
    )


async def serve(settings: Settings, *, ready: asyncio.Event | None = None) -> None:
    log = logs.get("bridge")
    loop = asyncio.get_running_loop()
    tokens = TokenFile(settings.admin_token_file) if settings.admin_token_file else None
    await wait_for_broker(settings.broker, settings.upstream_stomp)
    config = delay_config(settings)
    fmt = staged_format(settings)
    layout = layout_for(fmt, settings.staging_prefix)
    await loop.run_in_executor(None, _prepare_staging, settings, layout)
    metrics = Metrics()
    staging = StagingStats(slots=shared_slots()) if settings.staging_engine else StagingStats()
    staging.register(metrics.registry)
    targets = target_checks(settings)
    journal = Journal.open(settings, metrics.registry)
    journaled = journal.sinks if journal is not None else []
    guard = StagingGuard(layout)
    delay = DelayInterceptor(fmt=fmt, config=config, layout=layout,
                             sinks=[StatsSink(staging), *journaled], targets=targets)
    chain = Chain([
        guard,
        delay,
        RedeliveryInterceptor(
            table=settings.redelivery, fmt=fmt, layout=layout,
            undelivered=f"/queue/{settings.undelivered_queue}",
            sinks=[FailureTally(metrics.relay.redeliveries, metrics.relay.dead_letters),
                   LogSink(logs.get("redelivery")), *journaled],
        ),
    ])
    stomp = StompServer(
        broker=settings.broker,
        upstream=settings.upstream_stomp,
        chain=chain,
        stats=metrics.relay,
        handshake_timeout=settings.handshake_timeout,
        max_connections=settings.max_connections,
        max_per_address=settings.max_connections_per_address,
    )
    admin = Admin(
        metrics=metrics,
        broker=settings.broker,
        upstream=settings.upstream_stomp,
        staging=lambda: staging_broker(settings),
        layout=layout,
        staging_stats=staging,
        redelivery=settings.redelivery,
        tokens=tokens,
        upstream_amqp=bridge_amqp(settings) if settings.amqp_listen is not None else None,
    )
    await _listen("--stomp-listen", settings.stomp_listen, stomp.listen(settings.stomp_listen))
    await _listen("--admin-listen", settings.admin_listen, admin.start(settings.admin_listen))
    amqp: AmqpRelay | None = None
    if settings.amqp_listen is not None:
        # The same interceptors, on the same views, for publishes and consumers alike.
        upstream_amqp = bridge_amqp(settings)
        amqp = AmqpRelay(upstream_amqp.host, upstream_amqp.port, chain=chain,
                         stats=metrics.count_amqp())
        where = settings.amqp_listen
        await _listen("--amqp-listen", where, amqp.listen(where.host, where.port))

    engine = EngineProcess(
        settings, layout, staging,
        journal=(journal.spec, journal.engine_counters) if journal is not None else None,
    ) if settings.staging_engine else None
    watching: asyncio.Task[None] | None = None
    if engine is not None:
        staging.pending = lambda: staging.pending_count
        engine.start()
        watching = asyncio.create_task(engine.watch())
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "listening",
        broker=settings.broker,
        stomp=str(settings.stomp_listen),
        amqp=str(settings.amqp_listen) if settings.amqp_listen else "off",
        admin=str(settings.admin_listen),
        admin_token="file" if tokens is not None else "none: /staged refused",
        upstream=str(settings.upstream_stomp),
    )
    if ready is not None:
        ready.set()
    await stop.wait()
    log.info("shutting down", open=len(stomp.links))
    await stomp.shutdown()
    if amqp is not None:
        await amqp.close()
    if engine is not None and watching is not None:
        watching.cancel()
        await engine.close()
    await admin.stop()
    if journal is not None:
        journal.close()
    log.info("stopped")
