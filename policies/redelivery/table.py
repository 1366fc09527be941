"""The ``redelivery:`` section of the configuration, compiled into a PolicyTable.

Shape (already loaded from YAML into plain dicts and strings)::

    redelivery:
      "/queue/orders.*": "5:1000; 10:5000; 50:move(queue:dlq$error)"
      "/queue/billing": {dialect: weblogic, redelivery-limit: 5, error-destination: billing.err}
      users:
        batch:
          "/queue/orders.*": "50:delete"

Each key is a destination pattern, with the wildcards of :func:`policies.delay.matches`; each
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
from dataclasses import dataclass

from policies.delay import matches
from policies.errors import ConfigError
from policies.redelivery.dialects import parse_policy
from policies.redelivery.jmsjca import DEFAULT_POLICY
from policies.redelivery.model import Policy
from policies.redelivery.settings import describe_value

__all__ = ["USERS_KEY", "PolicyTable", "compile_table", "specificity"]

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
    """Patterns and their policies, the server's and each user's."""

    server: Section = ()
    users: tuple[tuple[str, Section], ...] = ()
    default: Policy = DEFAULT_POLICY

    def lookup(self, destination: str, user: str | None = None) -> tuple[str | None, Policy]:
        """The pattern that governs ``destination`` for ``user`` and its policy; ``(None,
        default)`` when no pattern matches."""
        if user is not None:
            for name, section in self.users:
                if name == user:
                    found = _best(section, destination)
                    if found is not None:
                        return found
        found = _best(self.server, destination)
        return found if found is not None else (None, self.default)


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
            matches(pattern, "/queue/x")  # validates the pattern
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


def _best(section: Section, destination: str) -> tuple[str, Policy] | None:
    found = [(pattern, policy) for pattern, policy in section if matches(pattern, destination)]
    if not found:
        return None
    return max(found, key=lambda entry: specificity(entry[0]))
