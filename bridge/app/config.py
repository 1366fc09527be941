"""Settings of ``jms-bridge``: flags beat environment beats config file beats defaults.

Every setting is declared once, as a field of ``Settings`` whose metadata (``setting``) says
how its value is parsed and, for the flags, their metavar and help; the command line, the
environment, the YAML keys and the docs' settings table (checked by a test) follow from it.
Every setting has one name, the flag's (``upstream-stomp``). The environment spells it
``JMS_BRIDGE_UPSTREAM_STOMP``; a YAML config file spells it ``upstream-stomp`` or
``upstream_stomp``. Values are validated here, once, into plain typed values, so the rest of
the bridge never sees a string it has to parse.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from bridge.app import settings_parse as sp

# Re-exported: the rest of the bridge knows these from here.
from bridge.app.settings_parse import ACTIVEMQ_SCHEDULER as ACTIVEMQ_SCHEDULER
from bridge.app.settings_parse import BROKERS as BROKERS
from bridge.app.settings_parse import LOG_FORMATS as LOG_FORMATS
from bridge.app.settings_parse import LOG_LEVELS as LOG_LEVELS
from bridge.app.settings_parse import STAGING_QUEUE_TYPES as STAGING_QUEUE_TYPES
from bridge.app.settings_parse import UNITS
from bridge.app.settings_parse import parse_hostport as parse_hostport
from bridge.app.settings_parse import parse_url as parse_url
from bridge.app.settings_parse import parse_urls as parse_urls
from policies.endpoints import Endpoint
from policies.errors import ConfigError
from policies.redelivery import PolicyTable
from policies.retry import RetryTable

ENV_PREFIX = "JMS_BRIDGE_"


def setting(parse: Callable[[Any, str], Any], *, metavar: str | None = None,
            help: str | None = None, flag: bool = True, connection: bool = False,
            choices: tuple[str, ...] | None = None, any_case: bool = False,
            names_itself: bool = False) -> dict[str, Any]:
    """The one declaration of a setting beside its field: how a raw value becomes the typed
    one (``parse(value, what)``) and, when it is a flag (``flag``; some are YAML and
    environment only), its metavar, help and argparse choices (``any_case``: the flag's
    choice may be in any case, as the file's and environment's are). ``connection``: every
    subcommand takes it, not only ``run``. ``names_itself``: the parser's errors name the
    setting on their own, so it gets the bare source as ``what``."""
    return {"parse": parse, "metavar": metavar, "help": help, "flag": flag,
            "connection": connection, "choices": choices, "any_case": any_case,
            "names_itself": names_itself}


_hostport = setting(parse_hostport, metavar="HOST:PORT")


@dataclass(frozen=True, slots=True)
class Settings:
    broker: str = field(default="rabbitmq", metadata=setting(
        partial(sp.choice, choices=BROKERS), choices=BROKERS, connection=True))
    upstream_stomp: Endpoint = field(
        default_factory=lambda: Endpoint("127.0.0.1", 61613), metadata=setting(
            partial(parse_urls, scheme="stomp", tls_scheme="stomp+ssl"), connection=True,
            metavar="stomp://[USER:PASS@]HOST:PORT"))
    upstream_amqp: Endpoint | None = field(default=None, metadata=setting(
        partial(parse_urls, scheme="amqp", vhost=True, tls_scheme="amqps"), connection=True,
        metavar="amqp://USER:PASS@HOST:PORT/VHOST"))
    upstream_management: Endpoint | None = field(default=None, metadata=setting(
        partial(parse_url, scheme="http"), connection=True,
        metavar="http://USER:PASS@HOST:PORT",
        help="RabbitMQ's management API, to see queue length limits (optional)"))
    stomp_listen: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 61633),
                                   metadata=_hostport)
    admin_listen: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 9613),
                                   metadata=_hostport)
    # AMQP 0-9-1 clients (RabbitMQ only); off unless given.
    amqp_listen: Endpoint | None = field(default=None, metadata=setting(
        parse_hostport, metavar="HOST:PORT",
        help="accept AMQP 0-9-1 clients here (RabbitMQ only; off unless given)"))
    log_format: str = field(default="console", metadata=setting(
        partial(sp.choice, choices=LOG_FORMATS), choices=LOG_FORMATS, connection=True))
    log_level: str = field(default="info", metadata=setting(
        partial(sp.choice, choices=LOG_LEVELS), choices=LOG_LEVELS, any_case=True,
        connection=True))
    staging_engine: bool = field(default=True, metadata=setting(
        sp.boolean, metavar="on|off",
        help="release staged messages in this process (off: only stage them)"))
    delay_headers: tuple[str, ...] = field(
        default=("x-delay", "AMQ_SCHEDULED_DELAY"), metadata=setting(
            sp.names, metavar="NAMES",
            help="comma-separated headers holding a relative delay in ms"))
    delivery_time_headers: tuple[str, ...] = field(
        default=("JMSDeliveryTime", "_AMQ_SCHED_DELIVERY"), metadata=setting(
            sp.names, metavar="NAMES",
            help="comma-separated headers holding an absolute delivery time (epoch ms)"))
    delay_disabled: tuple[str, ...] = field(default=(), metadata=setting(
        sp.names, metavar="PATTERNS",
        help="comma-separated destination patterns that may not be delayed"))
    # Destination patterns whose first deliveries carry JMSXDeliveryCount (1) too; elsewhere a
    # first delivery goes out as the broker sent it and only a redelivery carries the count.
    first_delivery_count: tuple[str, ...] = field(default=(), metadata=setting(
        sp.patterns, metavar="PATTERNS",
        help="comma-separated destination patterns whose first deliveries carry "
             "JMSXDeliveryCount 1 too (elsewhere only redeliveries carry it)"))
    activemq_scheduler: str = field(default="take", metadata=setting(
        partial(sp.choice, choices=ACTIVEMQ_SCHEDULER), metavar="take|passthrough",
        help="AMQ_SCHEDULED_* headers: staged by the bridge (take, the default) "
             "or left to ActiveMQ's own scheduler (passthrough; ActiveMQ only)"))
    staging_prefix: str = field(default="jms-bridge.staging", metadata=setting(
        partial(sp.text, expected="a queue name prefix without '/'", slash=False),
        metavar="NAME", help="name prefix of the staging queues", connection=True))
    # Messages the engine takes ahead from each level of up to about a minute: its memory is at
    # most about (levels streamed x this + 5,000 ready) x message size.
    staging_level_prefetch: int = field(default=1000, metadata=setting(
        partial(sp.whole_number, high=65535), metavar="N",
        help="messages taken ahead from each short level queue (default 1000)"))
    # The staging queues' type on RabbitMQ: quorum queues are replicated on a cluster's nodes
    # and survive the loss of one (of three); classic ones live on one node.
    staging_queue_type: str = field(default="classic", metadata=setting(
        partial(sp.choice, choices=STAGING_QUEUE_TYPES), metavar="classic|quorum",
        help="type of the staging queues: quorum replicates them on a RabbitMQ "
             "cluster (RabbitMQ only; default classic)"))
    # Redelivery policies by destination pattern (and per user): the YAML file's ``redelivery``
    # mapping, or the same as YAML text in JMS_BRIDGE_REDELIVERY. Empty: JMSJCA's default.
    redelivery: PolicyTable = field(default_factory=PolicyTable, metadata=setting(
        sp.redelivery, flag=False, names_itself=True))
    # Where a failed delivery goes when its policy says "undelivered" (TIBCO's
    # $sys.undelivered, WebSphere's system exception destination).
    undelivered_queue: str = field(default="jms-bridge.undelivered", metadata=setting(
        sp.queue_name, metavar="NAME",
        help="where failed deliveries go when their policy says undelivered "
             "(default jms-bridge.undelivered)"))
    # The messages the broker expires on its own that asked to be kept reach the undelivered
    # queue through the bridge. RabbitMQ: the queues (a regex of names) a policy of the bridge
    # gives its dead-letter exchange; None: no policy (the operator's may name the exchange).
    # ActiveMQ: the dead-letter queue it reads them from; None: none.
    expiry_policy: str | None = field(default=None, metadata=setting(
        sp.expiry_policy, metavar="REGEX|off",
        help="RabbitMQ: apply a policy (lowest priority, needs "
             "--upstream-management) that dead-letters the expired messages of "
             "the queues whose names match REGEX to the bridge, which keeps those "
             "that asked to be (JMS_TIBCO_PRESERVE_UNDELIVERED) on the undelivered "
             "queue (default off)"))
    expiry_dead_letter_queue: str | None = field(default="ActiveMQ.DLQ", metadata=setting(
        sp.queue_or_off, metavar="NAME|off",
        help="ActiveMQ: the dead-letter queue the broker moves expired messages "
             "to, from which the bridge takes those that asked to be kept to the "
             "undelivered queue (default ActiveMQ.DLQ; DLQ.> for "
             "per-destination dead-letter queues)"))
    # Message-retry of a release its target refused for a reason that can pass (queue full):
    # the YAML file's ``message-retry`` mapping (count, interval-ms, destination patterns), or
    # COUNT:INTERVAL_MS for the default (a flag, the environment). Default 10 x 1000 ms.
    message_retry: RetryTable = field(default_factory=RetryTable, metadata=setting(
        sp.message_retry, metavar="COUNT:INTERVAL_MS",
        help="retries of a release its target refused for a reason that can pass "
             "(queue full), and the wait between them (default 10:1000)"))
    # A client that has not sent a whole CONNECT in this time is closed (RabbitMQ's default).
    handshake_timeout: float = field(default=10.0, metadata=setting(
        sp.handshake_seconds, metavar="SECONDS",
        help="close a client that has not sent a whole CONNECT by then (default 10)"))
    # Client connections at once, in all and from one address: each costs two descriptors
    # (the client's and its upstream connection's).
    max_connections: int = field(default=10_000, metadata=setting(
        partial(sp.whole_number, high=1_000_000), metavar="N",
        help="client connections at once (default 10000)"))
    max_connections_per_address: int = field(default=1_000, metadata=setting(
        partial(sp.whole_number, high=1_000_000), metavar="N",
        help="client connections at once from one address (default 1000)"))
    # One STOMP frame (command, headers and body) from a client: a larger one is refused with
    # an ERROR frame as soon as its content-length says so or the limit is crossed. Below both
    # brokers' own limits (ActiveMQ's 100 MiB body, RabbitMQ's 128 MiB message).
    max_frame_bytes: int = field(default=64 * 1024 * 1024, metadata=setting(
        partial(sp.byte_size, low=4096, high=512 * UNITS["mib"]), metavar="SIZE",
        help="largest STOMP frame a client may send (default 64MiB)"))
    # Bytes held for all clients together (frames not yet complete or not yet taken by the
    # broker); past it the bridge stops reading clients until they are passed on.
    max_buffered_bytes: int = field(default=128 * 1024 * 1024, metadata=setting(
        partial(sp.byte_size, low=UNITS["mib"], high=64 * UNITS["gib"]), metavar="SIZE",
        help="bytes held for all clients together before the bridge stops "
             "reading them (default 128MiB)"))
    # TLS listeners for STOMP and AMQP 0-9-1 clients, with their certificate and key (PEM,
    # reloaded when they change) and, for mutual TLS, the CA client certificates must be signed
    # by.
    stomp_tls_listen: Endpoint | None = field(default=None, metadata=setting(
        parse_hostport, metavar="HOST:PORT",
        help="accept STOMP clients over TLS here (needs --tls-cert, --tls-key)"))
    amqp_tls_listen: Endpoint | None = field(default=None, metadata=setting(
        parse_hostport, metavar="HOST:PORT",
        help="accept AMQP 0-9-1 clients over TLS here, as RabbitMQ's amqps port "
             "(RabbitMQ only; needs --tls-cert, --tls-key)"))
    tls_cert: str | None = field(default=None, metadata=setting(
        sp.pem_file, metavar="FILE", help="the TLS listeners' certificate (PEM)"))
    tls_key: str | None = field(default=None, metadata=setting(
        sp.pem_file, metavar="FILE", help="its private key (PEM)"))
    tls_client_ca: str | None = field(default=None, metadata=setting(
        sp.pem_file, metavar="FILE",
        help="ask clients for a certificate signed by this CA (mutual TLS)"))
    # The CA file a TLS upstream (stomp+ssl://, amqps://) is verified against; else the system's.
    upstream_ca: str | None = field(default=None, metadata=setting(
        sp.pem_file, metavar="FILE", connection=True,
        help="CA file to verify a stomp+ssl:// or amqps:// broker against"))
    # Seconds to wait for the broker at start before exiting 1 (the old fail-fast start);
    # None: start at once and connect whenever the broker comes.
    upstream_wait: float | None = field(default=None, metadata=setting(
        sp.wait_seconds, metavar="SECONDS",
        help="exit 1 if the broker does not answer within SECONDS of start "
             "(default: start anyway and connect when it comes)"))
    # Bearer tokens of the admin API, one a line (read by bridge.app.auth when serving).
    admin_token_file: str | None = field(default=None, metadata=setting(
        partial(sp.text, expected="the path of a file holding the admin token", show=False),
        metavar="FILE",
        help="bearer token(s) the admin API asks for, one a line (re-read when "
             "the file changes); without it the /staged endpoints are refused"))
    # The event journal's folder (``bridge.app.journal``); None: no journal.
    journal: str | None = field(default=None, metadata=setting(
        partial(sp.text, expected="a folder"), metavar="DIR",
        help="write every message's events as JSON lines to files in DIR (off "
             "unless given)"))
    # The staged catalogue's SQLite file (``bridge.staging.catalogue``); None: none.
    staged_catalogue: str | None = field(default=None, metadata=setting(
        partial(sp.text, expected="the path of a file", trailing_slash=False), metavar="FILE",
        help="index the messages this bridge stages in this SQLite file, so that "
             "`staged list` and `cancel` answer without reading the staging "
             "queues (off unless given)"))
    # The bridge's own broker user and password, for the upstream URLs that carry none: a
    # Kubernetes Secret's keys as they are, with nothing to percent-encode into a URL. No
    # flag, so that no password shows in a process list.
    broker_user: str | None = field(default=None, metadata=setting(sp.credential, flag=False))
    broker_password: str | None = field(default=None, repr=False,
                                        metadata=setting(sp.credential, flag=False))


def _flag(name: str) -> str:
    return name.replace("_", "-")


SETTING_NAMES: tuple[str, ...] = tuple(_flag(f.name) for f in fields(Settings))
SETTINGS: dict[str, Field[Any]] = {_flag(f.name): f for f in fields(Settings)}


def _convert(name: str, value: Any, source: str) -> Any:
    f = SETTINGS.get(name)
    if f is None:
        raise ConfigError(f"unknown setting {name!r} (from {source})")
    what = source if f.metadata["names_itself"] else f"{name} (from {source})"
    return f.metadata["parse"](value, what)


def read_config_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {path}: {problem}{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of setting: value at the top")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = _flag(str(key))
        if name not in SETTING_NAMES:
            raise ConfigError(
                f"config file {path}: unknown setting {key!r} (known: {', '.join(SETTING_NAMES)})"
            )
        out[name] = value
    return out


def from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in SETTING_NAMES:
        key = ENV_PREFIX + name.upper().replace("-", "_")
        if key in environ:
            out[name] = environ[key]
    return out


def resolve(
    flags: Mapping[str, Any],
    *,
    config_file: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Merge the three sources, flag beating environment beating file, and validate."""
    environ = os.environ if environ is None else environ
    if config_file is None:
        config_file = environ.get(ENV_PREFIX + "CONFIG") or None
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if config_file:
        layers.append((f"config file {config_file}", read_config_file(config_file)))
    layers.append(("environment", from_environment(environ)))
    layers.append(("flag", {k: v for k, v in flags.items() if v is not None}))
    values: dict[str, Any] = {}
    for source, layer in layers:
        for name, raw in layer.items():
            value = _convert(name, raw, f"--{name}" if source == "flag" else source)
            earlier = values.get(name)
            if isinstance(earlier, RetryTable) and isinstance(raw, str) and ":" in raw \
                    and raw.strip()[:1].isdigit():
                # COUNT:INTERVAL_MS sets the default: the file's patterns stay.
                value = RetryTable(value.default, earlier.entries)
            values[name] = value
    settings = Settings(**{n.replace("-", "_"): v for n, v in values.items()})
    # Patterns are read in the broker's destination forms, known once every layer is merged.
    settings = replace(
        settings,
        redelivery=settings.redelivery.on(settings.broker, source=_source_of(layers, "redelivery")),
        message_retry=settings.message_retry.on(settings.broker,
                                                source=_source_of(layers, "message-retry")),
    )
    if settings.upstream_amqp is not None and settings.broker != "rabbitmq":
        raise ConfigError("upstream-amqp: AMQP 0-9-1 upstream is only for --broker rabbitmq")
    if settings.amqp_listen is not None and settings.broker != "rabbitmq":
        raise ConfigError("amqp-listen: the AMQP 0-9-1 front-end is only for --broker rabbitmq")
    if settings.amqp_tls_listen is not None and settings.broker != "rabbitmq":
        raise ConfigError("amqp-tls-listen: the AMQP 0-9-1 front-end is only for --broker "
                          "rabbitmq")
    for what, where in (("stomp-tls-listen", settings.stomp_tls_listen),
                        ("amqp-tls-listen", settings.amqp_tls_listen)):
        if where is not None and not (settings.tls_cert and settings.tls_key):
            raise ConfigError(f"{what}: needs --tls-cert and --tls-key (PEM files)")
    if settings.broker != "rabbitmq" and settings.upstream_stomp.alternates:
        raise ConfigError("upstream-stomp: a list of broker nodes is for a RabbitMQ cluster; "
                          "give ActiveMQ one address")
    if settings.broker_user is not None or settings.broker_password is not None:
        settings = _with_credentials(settings)
    ca = settings.upstream_ca
    if ca is not None:  # the CA travels with the endpoints it verifies
        settings = replace(settings, upstream_stomp=_with_ca(settings.upstream_stomp, ca))
        if settings.upstream_amqp is not None:
            settings = replace(settings, upstream_amqp=_with_ca(settings.upstream_amqp, ca))
    if settings.staging_queue_type == "quorum" and settings.broker != "rabbitmq":
        raise ConfigError("staging-queue-type: quorum queues are RabbitMQ's; ActiveMQ has none "
                          "(use classic, the default, with --broker activemq)")
    if settings.activemq_scheduler == "passthrough" and settings.broker != "activemq":
        raise ConfigError("activemq-scheduler: passthrough leaves AMQ_SCHEDULED_* to "
                          "ActiveMQ's own scheduler; RabbitMQ has none (use take, the default)")
    if settings.expiry_policy is not None and settings.broker != "rabbitmq":
        raise ConfigError("expiry-policy: a RabbitMQ policy; with --broker activemq the "
                          "bridge reads --expiry-dead-letter-queue")
    if settings.upstream_management is not None and settings.broker != "rabbitmq":
        raise ConfigError("upstream-management: RabbitMQ's management API is only for "
                          "--broker rabbitmq")
    return settings


def _source_of(layers: list[tuple[str, Mapping[str, Any]]], name: str) -> str:
    """Which layer a setting's value came from, as its errors name it."""
    for source, layer in reversed(layers):
        if name in layer and layer[name] is not None:
            return f"--{name}" if source == "flag" else source
    return "configuration"


def _with_credentials(settings: Settings) -> Settings:
    """broker-user and broker-password on every upstream endpoint whose URL names none."""
    def fill(endpoint: Endpoint) -> Endpoint:
        first, *rest = (replace(e, user=e.user or settings.broker_user,
                                password=e.password or settings.broker_password)
                        for e in endpoint.every())
        return replace(first, alternates=tuple(rest))

    amqp, management = settings.upstream_amqp, settings.upstream_management
    return replace(settings, upstream_stomp=fill(settings.upstream_stomp),
                   upstream_amqp=fill(amqp) if amqp is not None else None,
                   upstream_management=fill(management) if management is not None else None)


def _with_ca(endpoint: Endpoint, ca_file: str) -> Endpoint:
    return replace(endpoint, ca_file=ca_file,
                   alternates=tuple(replace(e, ca_file=ca_file) for e in endpoint.alternates))


def bridge_amqp(settings: Settings) -> Endpoint:
    """The AMQP endpoint of the bridge's own RabbitMQ connections: --upstream-amqp, else the
    STOMP host (each of them) on 5672 with the STOMP credentials (guest/guest when none) and
    vhost /."""
    if settings.upstream_amqp is not None:
        return settings.upstream_amqp
    first, *rest = (_amqp_of(s) for s in settings.upstream_stomp.every())
    return replace(first, alternates=tuple(rest))


def _amqp_of(s: Endpoint) -> Endpoint:
    if s.tls:  # RabbitMQ's amqps port, verified as the STOMP one is
        return Endpoint(s.host, 5671, s.user or "guest", s.password or "guest", "/", True,
                        s.ca_file)
    return Endpoint(s.host, 5672, s.user or "guest", s.password or "guest", "/")


def bridge_stomp(settings: Settings) -> Endpoint:
    """The STOMP endpoint of the bridge's own ActiveMQ connections (admin/admin when none)."""
    s = settings.upstream_stomp
    return Endpoint(s.host, s.port, s.user or "admin", s.password or "admin", tls=s.tls,
                    ca_file=s.ca_file)
