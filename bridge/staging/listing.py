"""What is staged, for ``jms-bridge staged list|count``: rows read from the staging queues in
scan order and from the running engines' answers (what they hold, their catalogues), rendered."""

from __future__ import annotations

import base64
import datetime as dt
import functools
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import structlog

from adapters.base import Message, StagingBroker
from bridge.staging import envelope, series
from bridge.staging.asking import ANSWER_S, ask, reply_topic
from bridge.staging.levels import Layout
from bridge.staging.orders import (
    CATALOGUE,
    ENGINE,
    MOVED_FORGOTTEN,
    Order,
    OrderAction,
    destination,
    rows_of,
)
from bridge.staging.selection import compile_for, picks
from policies.errors import BrokerUnavailable, Refused
from policies.naming import target_forms
from policies.selector import Selector

# Added to the time a listing asks the engines to remember their moves for: the engines'
# clocks and the tool's do not tick quite alike.
MOVED_MARGIN_MS = 1_000


@dataclass(frozen=True, slots=True)
class Row:
    message_id: str
    target: str
    due_ms: int
    size: int
    queue: str
    series: str = ""  # a scheduler series' copy: what remains of it (``series.summary``)

    @classmethod
    def of(cls, row: dict[str, object]) -> Row:
        """A row of an engine's list answer; KeyError or ValueError when it is not one."""
        return cls(str(row["message_id"]), str(row["target"]), int(str(row["due_ms"])),
                   int(str(row["size"])), str(row["queue"]), str(row.get("series", "")))

    @property
    def due(self) -> str:
        return dt.datetime.fromtimestamp(self.due_ms / 1000, dt.UTC).isoformat(
            timespec="milliseconds"
        )


def rows(
    broker: StagingBroker,
    layout: Layout,
    *,
    target: str | None = None,
    message_id: str | None = None,
    answer_s: float = ANSWER_S,
    unseen: dict[str, tuple[int, int]] | None = None,
    scan: bool = False,
    selector: str | None = None,
    warnings: list[str] | None = None,
) -> Iterator[Row]:
    """The staged messages on the staging queues, and those the running engines hold where the
    broker does not show them (each once); or, unless ``scan``, what the running engines
    answer from their staged catalogues when every one keeps one. ``unseen`` gets the queues
    whose browse showed fewer messages than the broker counts on them: queue -> (shown,
    counted). ``selector``: only the messages this JMS selector selects, over their own
    headers (``bridge.staging.selection``); InvalidSelector when it does not parse.
    ``warnings`` gets what an operator must know of messages that may be missing: a running
    engine that did not answer in time, one that forgot some of what it moved meanwhile.

    The queues are read in the order messages move through them (``scan_order``), and the
    engines are asked last, for what they hold and what they let go of onto a staging queue
    since the reading began: a message moving meanwhile is listed (once) wherever it went."""
    # A queue's target however it was written (/queue/X, /amq/queue/X): each message once.
    listed: set[str] = set()
    for form in (None,) if target is None else target_forms(target, broker.format.broker):
        for row in _rows(broker, layout, form, message_id, answer_s, unseen, scan, selector,
                         warnings):
            if row.message_id not in listed:
                listed.add(row.message_id)
                yield row


def _rows(broker: StagingBroker, layout: Layout, target: str | None, message_id: str | None,
          answer_s: float, unseen: dict[str, tuple[int, int]] | None, scan: bool,
          selector: str | None, warnings: list[str] | None) -> Iterator[Row]:
    compiled = None if selector is None else compile_for(selector, broker.format.broker)
    if not scan:
        catalogued = catalogued_rows(broker, layout, target=target, message_id=message_id,
                                     wait_s=answer_s, selector=selector)
        if catalogued is not None:
            yield from catalogued
            return
    seen: set[str] = set()
    started = time.monotonic()
    for row in _queued_rows(broker, layout, target=target, message_id=message_id,
                            unseen=unseen, selector=compiled):
        if row.message_id not in seen:
            seen.add(row.message_id)
            yield row
    for row in held_rows(broker, layout, target=target, message_id=message_id,
                         wait_s=answer_s, selector=selector, since=started,
                         warnings=warnings):
        if row.message_id not in seen:
            seen.add(row.message_id)
            yield row


def staged_messages(
    broker: StagingBroker, layout: Layout, *, answer_s: float = ANSWER_S
) -> Iterator[Message]:
    """Every staged copy, with its headers and body: those on the staging queues, and those the
    running engines hold where the broker does not show them (each once)."""
    seen: set[str] = set()
    for queue in layout.queues:
        for message in broker.browse(queue):
            message_id = message.headers.get(envelope.MESSAGE_ID)
            if message_id is None or envelope.TARGET not in message.headers:
                continue
            seen.add(message_id)
            yield message
    if broker.sees_held or not broker.consumers(layout.ready):
        return
    order = Order.new(OrderAction.LIST, "", reply_topic(layout), bodies=True)
    for answer in ask(broker, layout, order, answer_s,
                       answers=broker.consumers(layout.ready)):
        try:
            for row in rows_of(answer.body):
                headers, body = row.get("headers"), row.get("body")
                if not isinstance(headers, dict) or not isinstance(body, str):
                    continue
                message_id = str(headers.get(envelope.MESSAGE_ID, ""))
                if message_id and message_id not in seen:
                    seen.add(message_id)
                    yield Message({str(k): str(v) for k, v in headers.items()},
                                  base64.b64decode(body))
        except (KeyError, ValueError) as error:
            structlog.get_logger("staging.tools").warning("ignored a bad list answer",
                                                          error=str(error))


def count(broker: StagingBroker, layout: Layout, *, answer_s: float = ANSWER_S,
          warnings: list[str] | None = None) -> int:
    """How many staged copies wait: the broker's own count of each staging queue (one request
    per queue, however many are pending), plus those the running engines hold where the broker
    does not count them (RabbitMQ's unacknowledged messages). Unlike ``rows`` it reads no
    message, so a duplicate a crash left counts twice; ``rows`` (``--target``) counts it once.
    Reading every message takes time in proportion to the number pending (docs/benchmarks.md:
    over half an hour at 10 million on RabbitMQ). A message moving between two queues while
    they are counted may count twice, never zero times (``rows``)."""
    started = time.monotonic()
    total = sum(broker.depths(scan_order(layout)).values())
    held = held_rows(broker, layout, target=None, message_id=None, wait_s=answer_s,
                     since=started, warnings=warnings, visible=broker.sees_held)
    return total + len(held)


# With ten million pending, reading the queues takes half an hour: bridges that keep a staged
# catalogue (``bridge.staging.catalogue``) answer instead, and ``rows`` reads no queue when every
# running engine keeps one (``scan=True`` reads them anyway: the truth, slowly).
def catalogued_rows(
    broker: StagingBroker, layout: Layout, *, target: str | None, message_id: str | None,
    wait_s: float, selector: str | None = None,
) -> list[Row] | None:
    """What the running engines answer from their staged catalogues, with what they hold;
    None unless an engine runs and every one answered from a catalogue within ``wait_s``."""
    engines: list[int] = []
    running = functools.partial(_running, broker, layout, engines)

    # RabbitMQ counts the engines at once (a passive declare); ActiveMQ's statistics plugin may
    # not answer a user it is not for (a 10 s wait, then the connection dropped), so there it
    # is asked only once an engine has answered.
    if not broker.sees_held and running() == 0:
        return None
    order = Order.new(OrderAction.LIST, message_id or "", reply_topic(layout), target=target,
                      catalogue=True, selector=selector)
    answers = ask(broker, layout, order, wait_s, answers=engines[-1] if engines else running,
                   quiet=True)
    if not answers or not engines or len(answers) < engines[-1] or any(
            CATALOGUE not in a.headers for a in answers):
        return None
    found: dict[str, Row] = {}
    for answer in answers:
        try:
            for row in map(Row.of, rows_of(answer.body)):
                if not _internal(row, layout):
                    found.setdefault(row.message_id, row)
        except (KeyError, ValueError) as error:
            structlog.get_logger("staging.tools").warning("a bad list answer", error=str(error))
            return None
    return sorted(found.values(), key=lambda r: r.due_ms)


def _running(broker: StagingBroker, layout: Layout, engines: list[int]) -> int:
    """How many staging engines run (the consumers of the ready queue), also noted in
    ``engines``; 0 when the broker will not say."""
    try:
        engines.append(broker.consumers(layout.ready))
    except (BrokerUnavailable, Refused):
        engines.append(0)
    return engines[-1]


def _internal(row: Row, layout: Layout) -> bool:
    """A staged cancel (its target is the control topic), not an application's message."""
    return row.target == destination(layout.control)


# Where the broker does not show the messages consumers hold (RabbitMQ: a get does not see
# unacknowledged messages), list and count ask every running engine for the ones it holds.
def held_rows(
    broker: StagingBroker, layout: Layout, *, target: str | None, message_id: str | None,
    wait_s: float, selector: str | None = None, since: float | None = None,
    warnings: list[str] | None = None, visible: bool = False,
) -> list[Row]:
    """What the running engines hold, from their answers to a list order, and (``since``:
    a ``time.monotonic()``) what they let go of onto a staging queue since then: it waits for
    one answer per consumer of the ready queue (each engine has one), up to ``wait_s``, and
    says in ``warnings`` how many did not answer. ``visible``: leave out what they hold on
    the queues the broker shows (a count has counted it), keep what they moved."""
    engines: list[int] = []
    running = functools.partial(_running, broker, layout, engines)

    # RabbitMQ counts the engines at once; ActiveMQ's statistics plugin may not answer a user
    # it is not for (a 10 s wait), so there it is asked once an engine has answered.
    if not broker.sees_held and running() == 0:
        return []
    # The engines' memory of moves must reach back to the start of the reading, when the
    # answer is made (up to ``wait_s`` after the order is sent).
    moved_ms = (None if since is None
                else round((time.monotonic() - since + wait_s) * 1000) + MOVED_MARGIN_MS)
    order = Order.new(OrderAction.LIST, message_id or "", reply_topic(layout), target=target,
                      selector=selector, moved_ms=moved_ms)
    answers = ask(broker, layout, order, wait_s, answers=engines[-1] if engines else running,
                   quiet=broker.sees_held)
    found: list[Row] = []
    forgot: list[str] = []
    for answer in answers:
        if MOVED_FORGOTTEN in answer.headers:
            forgot.append(answer.headers.get(ENGINE, "?"))
        try:
            found += (Row.of(r) for r in rows_of(answer.body) if not visible or r.get("moved"))
        except (KeyError, ValueError) as error:
            structlog.get_logger("staging.tools").warning("ignored a bad list answer",
                                                          error=str(error))
    if warnings is not None:
        counted = engines[-1] if engines else (running() if not answers else 0)
        if len(answers) < counted:
            names = ", ".join(sorted(a.headers.get(ENGINE, "?") for a in answers)) or "none"
            warnings.append(
                f"warning: {counted - len(answers)} of the {counted} running staging engines "
                f"did not answer within {wait_s:g} s (answered: {names}); the messages they "
                "hold are not listed or counted here")
        if forgot:
            warnings.append(
                f"warning: the staging engine(s) {', '.join(sorted(forgot))} no longer remember "
                "every message they moved while this read the staging queues; a message moved "
                "then may be missing here")
    return found


def _queued_rows(
    broker: StagingBroker,
    layout: Layout,
    *,
    target: str | None = None,
    message_id: str | None = None,
    unseen: dict[str, tuple[int, int]] | None = None,
    selector: Selector | None = None,
) -> Iterator[Row]:
    # ActiveMQ shows a browser only the first maxBrowsePageSize (400 by default) messages of a
    # queue, held ones included, and says nothing of the rest: compare with its own counts.
    counted: dict[str, int] = {}
    if unseen is not None and broker.sees_held:
        try:
            counted = broker.depths(layout.queues)
        except (BrokerUnavailable, Refused) as error:  # a user the statistics are not for
            structlog.get_logger("staging.tools").debug(
                "cannot compare with the broker's counts", error=str(error))
    for queue in scan_order(layout):
        shown = 0
        for message in broker.browse(queue):
            shown += 1
            try:
                info = envelope.Staged.of(message.headers)
            except (KeyError, ValueError):
                continue
            if target is not None and info.target != target:
                continue
            if message_id is not None and info.message_id != message_id:
                continue
            if selector is not None and not picks(selector, message.headers):
                continue
            row = Row(info.message_id, info.target, info.due_ms, len(message.body), queue,
                      series.summary(message.headers))
            if not _internal(row, layout):
                yield row
        if unseen is not None and shown < counted.get(queue, 0):
            unseen[queue] = (shown, counted[queue])


def scan_order(layout: Layout) -> tuple[str, ...]:
    """The staging queues in the order messages move through them: the longest level first,
    the ready queue last. A message only hops to a shorter level or the ready queue, its new
    copy confirmed before the old one is acknowledged, so a listing that reads in this order
    meets a message moving during it at least once: in the queue it left or in the one it
    entered, read later."""
    return (*(q for _, q in reversed(layout.levels)), layout.ready)


def unseen_warning(unseen: dict[str, tuple[int, int]]) -> str:
    """What an operator needs to know about a list or count that could not see every message."""
    shown = sum(s for s, _ in unseen.values())
    counted = sum(c for _, c in unseen.values())
    return (f"warning: the broker showed {shown:,} of the {counted:,} messages it counts on "
            f"{len(unseen)} staging queue(s) ({', '.join(sorted(unseen))}); the rest are not "
            f"listed or counted here. ActiveMQ lets a browser see only the first "
            f"maxBrowsePageSize (400 by default) messages of a queue")


def render(items: list[Row], *, as_json: bool) -> str:
    if as_json:
        return json.dumps([{**asdict(r), "due": r.due} for r in items], indent=2)
    if not items:
        return "no staged messages"
    lines = [f"{'MESSAGE ID':<48} {'TARGET':<32} {'DUE (UTC)':<29} {'SIZE':>8}"]
    if any(r.series for r in items):
        lines[0] += "  SERIES"
    for r in sorted(items, key=lambda r: r.due_ms):
        line = f"{r.message_id:<48} {r.target:<32} {r.due:<29} {r.size:>8}"
        lines.append(f"{line}  {r.series}" if r.series else line)
    return "\n".join(lines)
