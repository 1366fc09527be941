"""JMSJCA redelivery strings (Java CAPS ``JMSJCA.redeliveryhandling``), parsed into a Policy.

Grammar, as the Java CAPS JMS Reference gives it: entries separated by a semicolon (and a
space), each one of

- ``retries:delay`` - wait ``delay`` ms (at most 5,000, JMSJCA's ceiling) before each
  redelivery once ``retries`` redeliveries have failed;
- ``retries:move(queue:NAME)``, ``move(topic:NAME)``, ``move(same:NAME)`` - move the message;
  ``$`` in NAME is the source destination's name, ``same`` keeps the source's kind;
- ``retries:delete`` - delete the message.

A move or delete without ``retries:`` applies from the first failure. Retries increase from
entry to entry, and a move or delete is the last entry.

The off-by-one, from the reference's own words: ``5:1000`` means "no delay for the first five
attempts at redelivery, then a one-second delay for each subsequent attempt", retries counted
from the original rollback. Redelivery attempt k follows failure k (see
:mod:`policies.redelivery.model`), so failures 1-5 are redelivered at once and failure 6 (the
sixth failed delivery, JMSXDeliveryCount 6) waits 1000 ms: ``N:action`` governs failure N + 1
onwards. Likewise ``50:move(...)`` moves the message at its 51st failure, "after a total of 50
failed attempts" at redelivery.

With nothing configured, JMSJCA's default applies: :data:`DEFAULT_TEXT`. It has no terminal
entry, so the message is redelivered every 5 s for ever.
"""

from __future__ import annotations

import re

from policies.errors import ConfigError
from policies.redelivery.model import Backoff, Delete, MoveTo, Policy, Rule, Step

__all__ = ["DEFAULT_POLICY", "DEFAULT_TEXT", "MAX_DELAY_MS", "parse_jmsjca"]

DEFAULT_TEXT = "3:25; 5:50; 10:100; 20:1000; 50:5000"
MAX_DELAY_MS = 5000
DIALECT = "jmsjca"

_DIGITS = re.compile(r"[0-9]+")
_MOVE = re.compile(r"move\((.*)\)", re.IGNORECASE | re.DOTALL)
_MAX_DIGITS = 9  # a billion retries or ms is plenty; longer numbers are refused, not parsed


def parse_jmsjca(text: str) -> Policy:
    """Parse a JMSJCA redelivery string; a ConfigError names the offending entry."""
    if not isinstance(text, str):
        raise ConfigError(f"a JMSJCA redelivery string must be text, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise ConfigError("an empty JMSJCA redelivery string")
    steps: list[Step] = []
    for entry in (part.strip() for part in stripped.split(";")):
        if not entry:
            raise ConfigError(f"{stripped!r}: an empty entry (entries are separated by '; ')")
        step = _entry(entry)
        if steps:
            last = steps[-1]
            if last.terminal:
                raise ConfigError(f"{entry!r}: nothing can follow a move or delete entry")
            if step.after <= last.after:
                raise ConfigError(
                    f"{entry!r}: retries must increase from entry to entry "
                    f"({step.after} comes after {last.after})"
                )
        steps.append(step)
    return Policy(DIALECT, stripped, tuple(steps))


def _entry(entry: str) -> Step:
    """One ``retries:action`` entry."""
    head, sep, rest = entry.partition(":")
    if _is_action(entry):
        return Step(0, _action(entry, entry))
    if not sep:
        if _DIGITS.fullmatch(entry):
            raise ConfigError(f"{entry!r}: write retries:delay, e.g. 5:{entry}")
        raise ConfigError(f"{entry!r}: expected retries:delay, retries:move(...) or retries:delete")
    retries = head.strip()
    if not _DIGITS.fullmatch(retries) or len(retries) > _MAX_DIGITS:
        raise ConfigError(f"{entry!r}: retries must be a whole number, got {retries!r}")
    action = rest.strip()
    if _is_action(action):
        return Step(int(retries), _action(action, entry))
    if not _DIGITS.fullmatch(action) or len(action) > _MAX_DIGITS:
        hint = " (entries are separated by '; ', not ',')" if "," in action else ""
        raise ConfigError(f"{entry!r}: delay must be milliseconds, got {action!r}{hint}")
    delay = int(action)
    if delay > MAX_DELAY_MS:
        raise ConfigError(
            f"{entry!r}: delay {delay} ms is more than JMSJCA's maximum of {MAX_DELAY_MS} ms"
        )
    return Step(int(retries), Backoff(delay))


def _is_action(text: str) -> bool:
    lowered = text.lower()
    return lowered == "delete" or lowered.startswith("move")


def _action(action: str, entry: str) -> Rule:
    """``delete`` or ``move(kind:target)``."""
    if action.lower() == "delete":
        return Delete()
    match = _MOVE.fullmatch(action)
    if match is None:
        raise ConfigError(f"{entry!r}: expected move(queue:NAME), move(topic:NAME) or "
                          f"move(same:NAME)")
    kind, sep, target = match.group(1).partition(":")
    kind = kind.strip().lower()
    target = target.strip()
    if not sep or kind not in ("queue", "topic", "same"):
        raise ConfigError(f"{entry!r}: a move names queue:, topic: or same: and a target, "
                          f"e.g. move(queue:dlq$)")
    if not target:
        raise ConfigError(f"{entry!r}: the move has no target name")
    if any(c in target for c in "/()") or any(c.isspace() for c in target):
        raise ConfigError(f"{entry!r}: a move target is a name, without '/', brackets or spaces")
    return MoveTo(kind, target)


DEFAULT_POLICY = parse_jmsjca(DEFAULT_TEXT)
