"""The ``redelivery:`` section of the configuration, compiled into a PolicyTable.

Shape (already loaded from YAML into plain dicts and strings)::

    redelivery:
      "/queue/orders.*": "5:1000; 10:5000; 50:move(queue:dlq$error)"
      "/queue/billing": {dialect: weblogic, redelivery-limit: 5, error-destination: billing.err}
      users:
        batch:
          "/queue/orders.*": "50:delete"

Each key is a destination pattern, with the wildcards of :func:`policies.delay.matches`, read as
which queue or topic it names on the broker (:mod:`policies.naming`: ``/queue/orders.*`` covers
RabbitMQ's queue ``orders.x`` however a client names it, an AMQP consumer's too); each
value a policy (see :mod:`policies.redelivery.dialects`). The key ``users`` is special: it maps a
user name to that user's own pattern -> policy mapping, and when one of that user's patterns
matches, it wins over every server pattern (as a JMSJCA client's own redelivery settings override
the server's). For a destination literally named ``users``, write its prefix: ``/queue/users``.
With no pattern matching, JMSJCA's default policy applies.

Most specific wins. Of the patterns that match a destination, compare their names (the part
after the last ``/``) segment by segment from the left; at the first segment where they differ in
kind, a literal beats ``*``, which beats ``>`` or ``#``. If every segment is of the same kind, a
pattern with a prefix (``/queue/orders.*``) beats one without (``orders.*``). Two different
patterns can then only tie when they are the same pattern (``orders.>`` and ``orders.#``), which
is refused when the table is compiled. So ``/queue/orders.eu`` is governed by ``orders.eu``
rather than ``/queue/orders.*``, by ``/queue/orders.*`` rather than ``orders.*``, and by
``orders.*`` rather than ``orders.>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from policies.errors import ConfigError
from policies.naming import check_pattern, compile_pattern, named
from policies.redelivery.dialects import parse_policy
from policies.redelivery.jmsjca import DEFAULT_POLICY
from policies.redelivery.model import Policy
from policies.redelivery.settings import describe_value

__all__ = ["USERS_KEY", "PolicyTable", "compile_table", "same_patterns", "specificity"]

USERS_KEY = "users"
_LITERAL, _ONE, _TAIL = 2, 1, 0

Section = tuple[tuple[str, Policy], ...]


def specificity(pattern: str) -> tuple[tuple[int, ...], bool]:
    """The sort key of "most specific": larger is more specific (see the module docstring)."""
    prefix, _, name = pattern.rpartition("/")
    kinds = tuple(
        _ONE if segment == "*" else _TAIL if segment in (">", "#") else _LITERAL
        for segment in name.split(".")
    )
    return kinds, "/" in pattern


@dataclass(frozen=True, slots=True)
class PolicyTable:
    """Patterns and their policies, the server's and each user's, on ``broker`` (whose
    destination forms the patterns and destinations are read in)."""

    server: Section = ()
    users: tuple[tuple[str, Section], ...] = ()
    default: Policy = DEFAULT_POLICY
    broker: str = "rabbitmq"

    def lookup(self, destination: str, user: str | None = None) -> tuple[str | None, Policy]:
        """The pattern that governs ``destination`` (in any form a client names it by) for
        ``user`` and its policy; ``(None, default)`` when no pattern matches."""
        if user is not None:
            for name, section in self.users:
                if name == user:
                    found = _best(section, destination, self.broker)
                    if found is not None:
                        return found
        found = _best(self.server, destination, self.broker)
        return found if found is not None else (None, self.default)

    def patterns(self) -> tuple[tuple[str, str], ...]:
        """Every pattern with where it is configured: ``("redelivery", p)``, or the user's
        section."""
        return (*((("redelivery", p) for p, _ in self.server)),
                *((f"redelivery of user {name!r}", p)
                  for name, section in self.users for p, _ in section))

    def on(self, broker: str, *, source: str = "configuration") -> PolicyTable:
        """This table read in ``broker``'s destination forms; a ConfigError when two of a
        section's patterns name the same destinations there (``/queue/x`` and
        ``/amq/queue/x`` on RabbitMQ)."""
        for where, section in (("redelivery", self.server),
                               *((f"redelivery of user {n!r}", s) for n, s in self.users)):
            clash = same_patterns([p for p, _ in section], broker)
            if clash is not None:
                raise ConfigError(f"{source}: {where}: {clash[0]!r} and {clash[1]!r} are the "
                                  f"same pattern on {broker}")
        return replace(self, broker=broker)


def same_patterns(patterns: list[str], broker: str) -> tuple[str, str] | None:
    """Two of ``patterns`` that cover the same destinations on ``broker``, or None."""
    seen: dict[object, str] = {}
    for text in patterns:
        compiled = compile_pattern(text, broker)
        if compiled.never:
            continue
        segments = compiled.segments
        if segments and segments[-1] == "#":
            segments = (*segments[:-1], ">")
        key = (compiled.kind, compiled.scope, segments)
        if key in seen:
            return seen[key], text
        seen[key] = text
    return None


def compile_table(value: object, *, source: str = "configuration") -> PolicyTable:
    """Compile the ``redelivery:`` value; every ConfigError is one line naming ``source``, the
    pattern and the offending part. ``None`` (an empty ``redelivery:``) is an empty table."""
    if value is None:
        return PolicyTable()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: redelivery: must map destination patterns to policies, "
                          f"got {describe_value(value)}")
    users: list[tuple[str, Section]] = []
    server: dict[object, object] = {}
    for key, item in value.items():
        if key == USERS_KEY:
            users = _users(item, source)
        else:
            server[key] = item
    return PolicyTable(_section(server, source, "redelivery"), tuple(users))


def _users(value: object, source: str) -> list[tuple[str, Section]]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: redelivery: users: must map user names to their patterns, "
                          f"got {describe_value(value)}")
    users = []
    for name, section in value.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{source}: redelivery: users: a user name must be text, got "
                              f"{describe_value(name)}")
        where = f"redelivery of user {name!r}"
        if not isinstance(section, Mapping):
            raise ConfigError(f"{source}: {where}: must map destination patterns to policies, "
                              f"got {describe_value(section)}")
        users.append((name, _section(section, source, where)))
    return users


def _section(value: Mapping[object, object], source: str, where: str) -> Section:
    entries: list[tuple[str, Policy]] = []
    seen: dict[str, str] = {}
    for pattern, item in value.items():
        if not isinstance(pattern, str):
            raise ConfigError(f"{source}: {where}: a destination pattern must be text, got "
                              f"{describe_value(pattern)}")
        try:
            check_pattern(pattern)
            policy = parse_policy(item)
        except ConfigError as error:
            raise ConfigError(f"{source}: {where}: policy for {pattern!r}: {error}") from None
        same = pattern[:-1] + ">" if specificity(pattern)[0][-1] == _TAIL else pattern
        if same in seen:
            raise ConfigError(f"{source}: {where}: {seen[same]!r} and {pattern!r} are the same "
                              f"pattern")
        seen[same] = pattern
        entries.append((pattern, policy))
    return tuple(entries)


def _best(section: Section, destination: str, broker: str) -> tuple[str, Policy] | None:
    canonical = named(destination, broker)
    found = [(pattern, policy) for pattern, policy in section
             if compile_pattern(pattern, broker).matches(canonical)]
    if not found:
        return None
    return max(found, key=lambda entry: specificity(entry[0]))
