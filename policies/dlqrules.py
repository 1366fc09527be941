"""A dead-letter handler's rules table, as IBM MQ's ``runmqdlq`` reads one. Pure: text in,
rules out; a dead letter's facts in, the first matching rule's decision out.

    * comment lines start with * (runmqdlq's) or #; a line ending in + goes on on the next one
    INPUTQ(jms-bridge.undelivered) WAIT(YES) RETRYINT(5)      # control data (optional, first)
    REASON(MQRC_BACKOUT_THRESHOLD_REACHED) DESTQ(orders.*) ACTION(RETRY) RETRY(3)
    DESTQ(payments.*) ACTION(FWD) FWDQ(DLQ.$DESTQ)
    PERSIST(NO) ACTION(DISCARD)
    SELECTOR('region = ''EU''') ACTION(IGNORE)

Keywords are case-insensitive, values are case-sensitive; a value with spaces or parentheses is
quoted with single quotes ('' is a quote inside). ``#`` outside quotes and parentheses
starts a comment that runs to the end of the line. Patterns (all given must match):
``REASON(name or code)``, ``DESTQ(name)`` (the original destination, as a queue name or a
STOMP destination), with ``*`` (any characters) and ``?`` (one) as wildcards;
``PERSIST(YES|NO)``; ``SELECTOR('JMS selector')``. Actions: ``ACTION(RETRY)`` puts the message
back to its original destination, at most ``RETRY(n)`` times (default 1; the count travels on
the message), and a message that has had its retries matches the rule no more, so the next
rule decides; ``ACTION(FWD) FWDQ(dest)`` forwards it, ``$`` (or ``$DESTQ``) in ``dest`` standing
for the original destination's name and ``$REASON`` for the reason; ``ACTION(DISCARD)`` removes
it; ``ACTION(IGNORE)`` leaves it where it is. Every error names the line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fnmatch import translate

from policies.errors import ConfigError, InvalidSelector
from policies.selector import HeaderMap, Selector, compile_selector

ACTIONS = ("RETRY", "FWD", "DISCARD", "IGNORE")
PATTERN_KEYWORDS = ("REASON", "DESTQ", "PERSIST", "SELECTOR")
ACTION_KEYWORDS = ("ACTION", "FWDQ", "RETRY")
CONTROL_KEYWORDS = ("INPUTQ", "RETRYINT", "WAIT")
_TOKEN = re.compile(r"\s*([A-Za-z]+)\(((?:'(?:[^']|'')*'|[^()'\s])*)\)")
_QUEUE_PREFIXES = ("/queue/", "/amq/queue/", "/topic/")


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rules see of one dead letter."""

    reason: str | None  # MQRC/MQFB name, or the broker's own word ("rejected", "expired")
    reason_code: int | None
    destination: str | None  # where it was going, STOMP form
    persistent: bool
    retries: int  # how many times a RETRY rule put it back before
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Rule:
    line: int
    text: str
    action: str
    reason: re.Pattern[str] | None = None
    destq: re.Pattern[str] | None = None
    persistent: bool | None = None
    selector: Selector | None = None
    fwdq: str | None = None
    retry: int = 1

    def matches(self, facts: Facts) -> bool:
        if self.reason is not None and not (
            (facts.reason is not None and self.reason.fullmatch(facts.reason))
            or (facts.reason_code is not None and self.reason.fullmatch(str(facts.reason_code)))
        ):
            return False
        if self.destq is not None and not (
            facts.destination is not None
            and (self.destq.fullmatch(facts.destination)
                 or self.destq.fullmatch(destination_name(facts.destination)))
        ):
            return False
        if self.persistent is not None and facts.persistent is not self.persistent:
            return False
        if self.selector is not None and not self.selector.matches(facts.headers):
            return False
        return not (self.action == "RETRY" and facts.retries >= self.retry)


@dataclass(frozen=True, slots=True)
class Decision:
    rule: Rule | None  # None: no rule matched (the message is left, as IGNORE)
    action: str
    destination: str | None = None  # RETRY and FWD: where it goes (STOMP form)


@dataclass(frozen=True, slots=True)
class Control:
    inputq: str | None = None
    retry_interval_s: float = 60.0  # runmqdlq's RETRYINT default
    wait: bool = True


@dataclass(frozen=True, slots=True)
class Rules:
    rules: tuple[Rule, ...]
    control: Control = Control()

    def decide(self, facts: Facts) -> Decision:
        for rule in self.rules:
            if rule.matches(facts):
                if rule.action == "RETRY":
                    return Decision(rule, "RETRY", facts.destination)
                if rule.action == "FWD":
                    assert rule.fwdq is not None
                    return Decision(rule, "FWD", as_destination(substitute(rule.fwdq, facts)))
                return Decision(rule, rule.action)
        return Decision(None, "IGNORE")


def destination_name(destination: str) -> str:
    for prefix in _QUEUE_PREFIXES:
        if destination.startswith(prefix):
            return destination[len(prefix):]
    return destination


def as_destination(name: str) -> str:
    """A queue name as a STOMP destination; a destination (starting with /) as it is."""
    return name if name.startswith("/") else f"/queue/{name}"


def substitute(template: str, facts: Facts) -> str:
    name = destination_name(facts.destination or "")
    reason = facts.reason or ""
    out = re.sub(r"[$&]DESTQ", lambda _m: name, template)
    out = re.sub(r"[$&]REASON", lambda _m: reason, out)
    return out.replace("$", name)


def _wildcard(value: str) -> re.Pattern[str]:
    return re.compile(translate(value).removeprefix("(?s:").removesuffix(")\\Z"), re.S)


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == "'" and value[-1] == "'":
        return value[1:-1].replace("''", "'")
    return value


def _code(line: str, quoted: bool, depth: int) -> tuple[str, bool, int]:
    """``line`` without its ``# comment``: a ``#`` outside quotes and parentheses starts one
    (inside them it is part of a value). Returns the quote and parenthesis state at its end, for
    a rule continued on the next line."""
    for at, char in enumerate(line):
        if char == "'":
            quoted = not quoted  # '' inside a quoted value: out and straight back in
        elif quoted:
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif char == "#" and depth == 0:
            return line[:at].rstrip(), quoted, depth
    return line, quoted, depth


def _lines(text: str) -> list[tuple[int, str]]:
    """(first line number, logical line) with comments gone and + continuations joined."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    quoted, depth = False, 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("*") or line.startswith("#"):
            line = ""  # a comment line, runmqdlq's (*) or ours (#)
        if pending is None:
            quoted, depth = False, 0
        line, quoted, depth = _code(line, quoted, depth)
        if pending is not None:
            start, before = pending
            line, pending = before + " " + line, None
        else:
            start = number
        if line.endswith("+"):
            pending = (start, line[:-1])
            continue
        if line:
            out.append((start, line))
    if pending is not None and pending[1].strip():
        out.append(pending)
    return out


def _pairs(line: str, where: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    at = 0
    while at < len(line):
        if not line[at:].strip():
            break
        match = _TOKEN.match(line, at)
        if match is None:
            at += len(line[at:]) - len(line[at:].lstrip())
            raise ConfigError(f"{where}: expected KEYWORD(value) at column {at + 1}: "
                              f"{line[at:].strip()[:30]!r}")
        keyword = match.group(1).upper()
        if keyword in pairs:
            raise ConfigError(f"{where}: {keyword} given twice")
        pairs[keyword] = _unquote(match.group(2))
        at = match.end()
    return pairs


def parse_rules(
    text: str, *, source: str = "rules", header_map: HeaderMap | None = None,
    compile_: Callable[..., Selector] = compile_selector,
) -> Rules:
    """The rules table in ``text``; ConfigError naming ``source`` and the line for any error.
    ``header_map``: how selectors read a message's headers (the broker's)."""
    rules: list[Rule] = []
    control = Control()
    lines = _lines(text)
    for index, (number, line) in enumerate(lines):
        where = f"{source} line {number}"
        pairs = _pairs(line, where)
        if set(pairs) <= set(CONTROL_KEYWORDS):
            if index != 0:
                raise ConfigError(f"{where}: control data (INPUTQ, RETRYINT, WAIT) must be the "
                                  "first line")
            control = _control(pairs, where)
            continue
        rules.append(_rule(number, line, pairs, where, header_map, compile_))
    if not rules:
        raise ConfigError(f"{source}: no rules (each rule needs ACTION(...))")
    return Rules(tuple(rules), control)


def _control(pairs: dict[str, str], where: str) -> Control:
    interval = 60.0
    if "RETRYINT" in pairs:
        try:
            interval = float(pairs["RETRYINT"])
        except ValueError:
            interval = -1
        if not math.isfinite(interval) or interval < 0:  # (float() takes "nan" and "inf")
            raise ConfigError(f"{where}: RETRYINT must be a number of seconds, "
                              f"not {pairs['RETRYINT']!r}")
    wait = pairs.get("WAIT", "YES").upper()
    if wait not in ("YES", "NO"):
        raise ConfigError(f"{where}: WAIT must be YES or NO, not {pairs['WAIT']!r}")
    return Control(pairs.get("INPUTQ") or None, interval, wait == "YES")


def _rule(
    number: int, line: str, pairs: dict[str, str], where: str, header_map: HeaderMap | None,
    compile_: Callable[..., Selector],
) -> Rule:
    unknown = set(pairs) - set(PATTERN_KEYWORDS) - set(ACTION_KEYWORDS)
    if unknown:
        raise ConfigError(f"{where}: unknown keyword {sorted(unknown)[0]} (patterns: "
                          f"{', '.join(PATTERN_KEYWORDS)}; actions: {', '.join(ACTION_KEYWORDS)})")
    if "ACTION" not in pairs:
        raise ConfigError(f"{where}: a rule needs ACTION({'|'.join(ACTIONS)})")
    action = pairs["ACTION"].upper()
    if action not in ACTIONS:
        raise ConfigError(f"{where}: ACTION must be one of {', '.join(ACTIONS)}, "
                          f"not {pairs['ACTION']!r}")
    fwdq = pairs.get("FWDQ")
    if action == "FWD" and not fwdq:
        raise ConfigError(f"{where}: ACTION(FWD) needs FWDQ(destination)")
    if action != "FWD" and fwdq is not None:
        raise ConfigError(f"{where}: FWDQ is only for ACTION(FWD)")
    retry = 1
    if "RETRY" in pairs:
        if action != "RETRY":
            raise ConfigError(f"{where}: RETRY(n) is only for ACTION(RETRY)")
        retries = pairs["RETRY"]
        if not (retries.isascii() and retries.isdigit()) or not 1 <= int(retries) <= 999_999_999:
            raise ConfigError(f"{where}: RETRY must be a whole number from 1 to 999999999, "
                              f"not {pairs['RETRY']!r}")
        retry = int(pairs["RETRY"])
    persistent: bool | None = None
    if "PERSIST" in pairs:
        value = pairs["PERSIST"].upper()
        if value in ("YES", "MQPER_PERSISTENT"):
            persistent = True
        elif value in ("NO", "MQPER_NOT_PERSISTENT"):
            persistent = False
        else:
            raise ConfigError(f"{where}: PERSIST must be YES or NO, not {pairs['PERSIST']!r}")
    selector = None
    if "SELECTOR" in pairs:
        try:
            selector = (compile_(pairs["SELECTOR"], header_map) if header_map is not None
                        else compile_(pairs["SELECTOR"]))
        except InvalidSelector as bad:
            raise ConfigError(f"{where}: SELECTOR: {bad}") from None
    for keyword in ("REASON", "DESTQ"):
        if keyword in pairs and not pairs[keyword]:
            raise ConfigError(f"{where}: {keyword}() is empty")
    return Rule(
        line=number, text=line, action=action,
        reason=_wildcard(pairs["REASON"]) if "REASON" in pairs else None,
        destq=_wildcard(pairs["DESTQ"]) if "DESTQ" in pairs else None,
        persistent=persistent, selector=selector, fwdq=fwdq, retry=retry,
    )
