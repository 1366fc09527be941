"""The parse functions of the settings: each turns one raw value (a flag's or environment
variable's text, or a YAML value) into its typed value, or raises a ConfigError naming ``what``
(the setting and where its value came from)."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from typing import Any
from urllib.parse import unquote, urlsplit

import yaml

from policies.endpoints import Endpoint
from policies.errors import ConfigError
from policies.naming import check_pattern
from policies.redelivery import PolicyTable, compile_table
from policies.retry import RetryTable, compile_retry

BROKERS = ("rabbitmq", "activemq")
LOG_FORMATS = ("json", "console")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
STAGING_QUEUE_TYPES = ("classic", "quorum")
# ActiveMQ's scheduler headers (AMQ_SCHEDULED_*): the bridge stages them (take), or leaves them
# to a broker whose schedulerSupport is on (passthrough).
ACTIVEMQ_SCHEDULER = ("take", "passthrough")


def parse_hostport(value: str, what: str) -> Endpoint:
    value = str(value)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"{what}: expected HOST:PORT, got {value!r}")
    return Endpoint(host.strip("[]"), int(port))


def parse_urls(value: str, what: str, scheme: str, *, vhost: bool = False,
               tls_scheme: str | None = None) -> Endpoint:
    """One URL, or a comma-separated list of the nodes of one broker (a RabbitMQ cluster): the
    first, with the others as its ``alternates``, each taking the first's credentials, vhost
    and TLS when it names none."""
    value = str(value)
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
    value = str(value)
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


def choice(value: Any, what: str, choices: tuple[str, ...]) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise ConfigError(f"{what}: expected one of {', '.join(choices)}, got {str(value)!r}")
    return v


def boolean(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{what}: expected true or false, got {value!r}")


def names(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, list | tuple):
        items = [str(v).strip() for v in value]
    else:
        raise ConfigError(f"{what}: expected a list or a comma-separated string, got {value!r}")
    return tuple(v for v in items if v)


def patterns(value: Any, what: str) -> tuple[str, ...]:
    """Destination patterns, each checked."""
    found = names(value, what)
    for pattern in found:
        try:
            check_pattern(pattern)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    return found


UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2,
         "g": 1024**3, "gib": 1024**3}
_SIZE = re.compile(r"\s*(\d+)\s*([a-z]*)\s*")


def byte_size(value: Any, what: str, low: int, high: int) -> int:
    """A number of bytes, plain or with a binary unit: 65536, 64KiB, 64MiB, 1GiB."""
    m = _SIZE.fullmatch(str(value).lower())
    if m is None or m.group(2) not in UNITS:
        raise ConfigError(f"{what}: expected a size in bytes (65536, 64KiB, 64MiB), got {value!r}")
    size = int(m.group(1)) * UNITS[m.group(2)]
    if not low <= size <= high:
        raise ConfigError(f"{what}: expected from {low} to {high} bytes, got {value!r}")
    return size


def whole_number(value: Any, what: str, high: int) -> int:
    text = str(value).strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= high:
        raise ConfigError(f"{what}: expected a whole number from 1 to {high}, got {value!r}")
    return int(text)


def handshake_seconds(value: Any, what: str) -> float:
    try:
        seconds = float(str(value).strip())
    except ValueError:
        seconds = -1.0
    if not 0.1 <= seconds <= 3600:
        raise ConfigError(f"{what}: expected seconds from 0.1 to 3600, got {value!r}")
    return seconds


def wait_seconds(value: Any, what: str) -> float | None:
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


def text(value: Any, what: str, expected: str, *, slash: bool = True,
         trailing_slash: bool = True, show: bool = True) -> str:
    """A non-blank text, stripped; ``expected`` says what it must be."""
    v = str(value).strip()
    if not v or (not slash and "/" in v) or (not trailing_slash and v.endswith("/")):
        raise ConfigError(f"{what}: expected {expected}" + (f", got {value!r}" if show else ""))
    return v


pem_file = partial(text, expected="the path of a PEM file", show=False)
queue_name = partial(text, expected="a queue name without '/'", slash=False)


def expiry_policy(value: Any, what: str) -> str | None:
    v = str(value).strip()
    if v.lower() in ("", "off", "none"):
        return None
    try:
        re.compile(v)
    except re.error as exc:
        raise ConfigError(f"{what}: not a regular expression ({exc}): {value!r}") from None
    return v


def queue_or_off(value: Any, what: str) -> str | None:
    v = str(value).strip()
    if v.lower() in ("", "off", "none"):
        return None
    if "/" in v:
        raise ConfigError(f"{what}: expected a queue name without '/' (or off), got {value!r}")
    return v


def credential(value: Any, what: str) -> str:
    """A user name or password, as it is (spaces and all): only a blank one is refused."""
    v = str(value)
    if not v.strip():
        raise ConfigError(f"{what}: expected a user name or password, got a blank one")
    return v


def _yaml_text(value: str, what: str) -> Any:
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what}: not YAML: {exc}") from None


def message_retry(value: Any, what: str) -> RetryTable:
    if isinstance(value, str) and not value.strip()[:1].isdigit():  # YAML text
        value = _yaml_text(value, what)
    return compile_retry(value, source=what)


def redelivery(value: Any, source: str) -> PolicyTable:
    """The ``redelivery`` mapping; its errors name ``source`` and the setting themselves."""
    if isinstance(value, str):  # from the environment: YAML text
        value = _yaml_text(value, f"redelivery (from {source})")
    return compile_table(value, source=source)
