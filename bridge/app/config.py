"""Settings of ``jms-bridge``: flags beat environment beats config file beats defaults.

Every setting has one name, the flag's (``upstream-stomp``). The environment spells it
``JMS_BRIDGE_UPSTREAM_STOMP``; a YAML config file spells it ``upstream-stomp`` or
``upstream_stomp``. Values are validated here, once, into plain typed values, so the rest of
the bridge never sees a string it has to parse.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml

from policies.endpoints import Endpoint
from policies.errors import ConfigError
from policies.naming import check_pattern
from policies.redelivery import PolicyTable, compile_table
from policies.retry import RetryTable, compile_retry

ENV_PREFIX = "JMS_BRIDGE_"
BROKERS = ("rabbitmq", "activemq")
LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
STAGING_QUEUE_TYPES = ("classic", "quorum")
# ActiveMQ's scheduler headers (AMQ_SCHEDULED_*): the bridge stages them (take), or leaves them
# to a broker whose schedulerSupport is on (passthrough).
ACTIVEMQ_SCHEDULER = ("take", "passthrough")


@dataclass(frozen=True, slots=True)
class Settings:
    broker: str = "rabbitmq"
    upstream_stomp: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 61613))
    upstream_amqp: Endpoint | None = None
    upstream_management: Endpoint | None = None
    stomp_listen: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 61633))
    admin_listen: Endpoint = field(default_factory=lambda: Endpoint("127.0.0.1", 9613))
    # AMQP 0-9-1 clients (RabbitMQ only); off unless given.
    amqp_listen: Endpoint | None = None
    log_format: str = "console"
    log_level: str = "info"
    staging_engine: bool = True
    delay_headers: tuple[str, ...] = ("x-delay", "AMQ_SCHEDULED_DELAY")
    delivery_time_headers: tuple[str, ...] = ("JMSDeliveryTime", "_AMQ_SCHED_DELIVERY")
    delay_disabled: tuple[str, ...] = ()
    # Destination patterns whose first deliveries carry JMSXDeliveryCount (1) too; elsewhere a
    # first delivery goes out as the broker sent it and only a redelivery carries the count.
    first_delivery_count: tuple[str, ...] = ()
    activemq_scheduler: str = "take"
    staging_prefix: str = "jms-bridge.staging"
    # Messages the engine takes ahead from each level of up to about a minute: its memory is at
    # most about (levels streamed x this + 5,000 ready) x message size.
    staging_level_prefetch: int = 1000
    # The staging queues' type on RabbitMQ: quorum queues are replicated on a cluster's nodes
    # and survive the loss of one (of three); classic ones live on one node.
    staging_queue_type: str = "classic"
    # Redelivery policies by destination pattern (and per user): the YAML file's ``redelivery``
    # mapping, or the same as YAML text in JMS_BRIDGE_REDELIVERY. Empty: JMSJCA's default.
    redelivery: PolicyTable = field(default_factory=PolicyTable)
    # Where a failed delivery goes when its policy says "undelivered" (TIBCO's
    # $sys.undelivered, WebSphere's system exception destination).
    undelivered_queue: str = "jms-bridge.undelivered"
    # The messages the broker expires on its own that asked to be kept reach the undelivered
    # queue through the bridge. RabbitMQ: the queues (a regex of names) a policy of the bridge
    # gives its dead-letter exchange; None: no policy (the operator's may name the exchange).
    # ActiveMQ: the dead-letter queue it reads them from; None: none.
    expiry_policy: str | None = None
    expiry_dead_letter_queue: str | None = "ActiveMQ.DLQ"
    # Message-retry of a release its target refused for a reason that can pass (queue full):
    # the YAML file's ``message-retry`` mapping (count, interval-ms, destination patterns), or
    # COUNT:INTERVAL_MS for the default (a flag, the environment). Default 10 x 1000 ms.
    message_retry: RetryTable = field(default_factory=RetryTable)
    # A client that has not sent a whole CONNECT in this time is closed (RabbitMQ's default).
    handshake_timeout: float = 10.0
    # Client connections at once, in all and from one address: each costs two descriptors
    # (the client's and its upstream connection's).
    max_connections: int = 10_000
    max_connections_per_address: int = 1_000
    # One STOMP frame (command, headers and body) from a client: a larger one is refused with
    # an ERROR frame as soon as its content-length says so or the limit is crossed. Below both
    # brokers' own limits (ActiveMQ's 100 MiB body, RabbitMQ's 128 MiB message).
    max_frame_bytes: int = 64 * 1024 * 1024
    # Bytes held for all clients together (frames not yet complete or not yet taken by the
    # broker); past it the bridge stops reading clients until they are passed on.
    max_buffered_bytes: int = 128 * 1024 * 1024
    # TLS listeners for STOMP and AMQP 0-9-1 clients, with their certificate and key (PEM,
    # reloaded when they change) and, for mutual TLS, the CA client certificates must be signed
    # by.
    stomp_tls_listen: Endpoint | None = None
    amqp_tls_listen: Endpoint | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # The CA file a TLS upstream (stomp+ssl://, amqps://) is verified against; else the system's.
    upstream_ca: str | None = None
    # Seconds to wait for the broker at start before exiting 1 (the old fail-fast start);
    # None: start at once and connect whenever the broker comes.
    upstream_wait: float | None = None
    # Bearer tokens of the admin API, one a line (read by bridge.app.auth when serving).
    admin_token_file: str | None = None
    # The event journal's folder (``bridge.app.journal``); None: no journal.
    journal: str | None = None
    # The staged catalogue's SQLite file (``bridge.staging.catalogue``); None: none.
    staged_catalogue: str | None = None
    # The bridge's own broker user and password, for the upstream URLs that carry none: a
    # Kubernetes Secret's keys as they are, with nothing to percent-encode into a URL.
    broker_user: str | None = None
    broker_password: str | None = field(default=None, repr=False)


def _flag(name: str) -> str:
    return name.replace("_", "-")


SETTING_NAMES: tuple[str, ...] = tuple(_flag(f.name) for f in fields(Settings))


def parse_hostport(value: str, what: str) -> Endpoint:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}")
    return Endpoint(host.strip("[]"), int(port))


def parse_urls(value: str, what: str, scheme: str, *, vhost: bool = False,
               tls_scheme: str | None = None) -> Endpoint:
    """One URL, or a comma-separated list of the nodes of one broker (a RabbitMQ cluster): the
    first, with the others as its ``alternates``, each taking the first's credentials, vhost
    and TLS when it names none."""
    urls = [u.strip() for u in value.split(",")]
    if len(urls) == 1:
        return parse_url(value, what, scheme, vhost=vhost, tls_scheme=tls_scheme)
    if not all(urls):
        raise ConfigError(f"{what}: an empty address in the list {value!r}")
    first, *rest = (parse_url(u, what, scheme, vhost=vhost, tls_scheme=tls_scheme)
                    for u in urls)
    alternates = tuple(
        replace(e, user=e.user or first.user, password=e.password or first.password,
                vhost=first.vhost if e.vhost in (None, "/") else e.vhost)
        for e in rest)
    if any(e.tls != first.tls for e in alternates):
        raise ConfigError(f"{what}: every address of the list must use the same scheme, got "
                          f"{value!r}")
    return replace(first, alternates=alternates)


def parse_url(value: str, what: str, scheme: str, *, vhost: bool = False,
              tls_scheme: str | None = None) -> Endpoint:
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc} in {value!r}") from None
    if (parts.scheme not in (scheme, tls_scheme) or not parts.hostname or port is None):
        also = f" or {tls_scheme}://..." if tls_scheme else ""
        raise ConfigError(f"{what}: expected {scheme}://[USER:PASS@]HOST:PORT{also}, "
                          f"got {value!r}")
    path = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    return Endpoint(
        parts.hostname,
        port,
        unquote(parts.username) if parts.username else None,
        unquote(parts.password) if parts.password else None,
        (path or "/") if vhost else None,
        tls=parts.scheme == tls_scheme,
    )


def _choice(value: str, what: str, choices: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in choices:
        raise ConfigError(f"{what}: expected one of {', '.join(choices)}, got {value!r}")
    return v


def _bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}: expected true or false, got {value!r}")


def _names(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(v).strip() for v in value]
    else:
        raise ConfigError(f"{what}: expected a list or a comma-separated string, got {value!r}")
    return tuple(v for v in items if v)


_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2,
          "g": 1024**3, "gib": 1024**3}
_SIZE = re.compile(r"\s*(\d+)\s*([a-z]*)\s*")


def _byte_size(value: Any, what: str, low: int, high: int) -> int:
    """A number of bytes, plain or with a binary unit: 65536, 64KiB, 64MiB, 1GiB."""
    m = _SIZE.fullmatch(str(value).lower())
    if m is None or m.group(2) not in _UNITS:
        raise ConfigError(f"{what}: expected a size in bytes (65536, 64KiB, 64MiB), got {value!r}")
    size = int(m.group(1)) * _UNITS[m.group(2)]
    if not low <= size <= high:
        raise ConfigError(f"{what}: expected from {low} to {high} bytes, got {value!r}")
    return size


def _convert(name: str, value: Any, source: str) -> Any:
    what = f"{name} (from {source})"
    if name == "broker":
        return _choice(str(value), what, BROKERS)
    if name == "upstream-stomp":
        return parse_urls(str(value), what, "stomp", tls_scheme="stomp+ssl")
    if name == "upstream-amqp":
        return parse_urls(str(value), what, "amqp", vhost=True, tls_scheme="amqps")
    if name in ("tls-cert", "tls-key", "tls-client-ca", "upstream-ca"):
        v = str(value).strip()
        if not v:
            raise ConfigError(f"{what}: expected the path of a PEM file")
        return v
    if name == "upstream-management":
        return parse_url(str(value), what, "http")
    if name in ("stomp-listen", "admin-listen", "amqp-listen", "stomp-tls-listen",
                "amqp-tls-listen"):
        return parse_hostport(str(value), what)
    if name == "log-format":
        return _choice(str(value), what, LOG_FORMATS)
    if name == "log-level":
        return _choice(str(value), what, LOG_LEVELS)
    if name == "staging-engine":
        return _bool(value, what)
    if name == "staging-queue-type":
        return _choice(str(value), what, STAGING_QUEUE_TYPES)
    if name == "activemq-scheduler":
        return _choice(str(value), what, ACTIVEMQ_SCHEDULER)
    if name in ("delay-headers", "delivery-time-headers", "delay-disabled"):
        return _names(value, what)
    if name == "first-delivery-count":
        patterns = _names(value, what)
        for pattern in patterns:
            try:
                check_pattern(pattern)
            except ConfigError as exc:
                raise ConfigError(f"{what}: {exc}") from None
        return patterns
    if name == "staging-level-prefetch":
        text = str(value).strip()
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
            raise ConfigError(f"{what}: expected a whole number from 1 to 65535, got {value!r}")
        return int(text)
    if name == "handshake-timeout":
        try:
            seconds = float(str(value).strip())
        except ValueError:
            seconds = -1.0
        if not 0.1 <= seconds <= 3600:
            raise ConfigError(f"{what}: expected seconds from 0.1 to 3600, got {value!r}")
        return seconds
    if name == "max-frame-bytes":
        return _byte_size(value, what, 4096, 512 * _UNITS["mib"])
    if name == "max-buffered-bytes":
        return _byte_size(value, what, _UNITS["mib"], 64 * _UNITS["gib"])
    if name == "upstream-wait":
        text = str(value).strip().lower()
        if text in ("", "off", "none"):
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= 3600:
            raise ConfigError(f"{what}: expected seconds from 0 to 3600 (or off), got {value!r}")
        return seconds
    if name in ("max-connections", "max-connections-per-address"):
        text = str(value).strip()
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 1_000_000:
            raise ConfigError(f"{what}: expected a whole number from 1 to 1000000, got {value!r}")
        return int(text)
    if name == "undelivered-queue":
        v = str(value).strip()
        if not v or "/" in v:
            raise ConfigError(f"{what}: expected a queue name without '/', got {value!r}")
        return v
    if name == "expiry-policy":
        v = str(value).strip()
        if v.lower() in ("", "off", "none"):
            return None
        try:
            re.compile(v)
        except re.error as exc:
            raise ConfigError(f"{what}: not a regular expression ({exc}): {value!r}") from None
        return v
    if name == "expiry-dead-letter-queue":
        v = str(value).strip()
        if v.lower() in ("", "off", "none"):
            return None
        if "/" in v:
            raise ConfigError(f"{what}: expected a queue name without '/' (or off), "
                              f"got {value!r}")
        return v
    if name == "staging-prefix":
        v = str(value).strip()
        if not v or "/" in v:
            raise ConfigError(f"{what}: expected a queue name prefix without '/', got {value!r}")
        return v
    if name == "admin-token-file":
        v = str(value).strip()
        if not v:
            raise ConfigError(f"{what}: expected the path of a file holding the admin token")
        return v
    if name == "journal":
        v = str(value).strip()
        if not v:
            raise ConfigError(f"{what}: expected a folder, got {value!r}")
        return v
    if name == "staged-catalogue":
        v = str(value).strip()
        if not v or v.endswith("/"):
            raise ConfigError(f"{what}: expected the path of a file, got {value!r}")
        return v
    if name in ("broker-user", "broker-password"):
        v = str(value)
        if not v.strip():
            raise ConfigError(f"{what}: expected a user name or password, got a blank one")
        return v
    if name == "message-retry":
        if isinstance(value, str) and not value.strip()[:1].isdigit():  # YAML text
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{what}: not YAML: {exc}") from None
        return compile_retry(value, source=what)
    if name == "redelivery":
        if isinstance(value, str):  # from the environment: YAML text
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise ConfigError(f"{what}: not YAML: {exc}") from None
        return compile_table(value, source=source)
    raise ConfigError(f"unknown setting {name!r} (from {source})")


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
