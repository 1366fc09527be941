"""The ``jms-bridge`` command.

Every failure a person can cause (a bad flag, a broken config file, a broker that is not
there) ends with one line on stderr naming the problem and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from bridge import __version__
from bridge.app import dlq_args, logs
from bridge.app.config import SETTING_NAMES, SETTINGS, Settings, resolve
from bridge.app.progress import EXIT_INTERRUPTED
from bridge.pipeline.options import add_arguments as add_report_arguments
from bridge.pipeline.options import add_replay_arguments
from policies.errors import BridgeError, BrokerUnavailable, ConfigError, Refused

if TYPE_CHECKING:
    from adapters.base import StagingBroker
    from bridge.app.progress import Progress
    from bridge.staging.levels import Layout
    from bridge.staging.listing import Row
    from bridge.staging.operations import OrderOutcome

EXIT_USAGE = 2
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _setting_flag(p: argparse.ArgumentParser, name: str, help: str | None = None) -> None:
    """The flag of setting ``name`` as its field declares it (``help`` for another wording)."""
    meta = SETTINGS[name].metadata
    options: dict[str, Any] = {"help": help or meta["help"]}
    if meta["choices"] is not None:
        # argparse checks a choice itself, and says which ones there are
        options.update(choices=meta["choices"], default=None)
        if meta["any_case"]:
            options["type"] = str.lower
    else:
        options["metavar"] = meta["metavar"]
    p.add_argument(f"--{name}", **options)


def _connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (flag names as keys)")
    for name, f in SETTINGS.items():
        if f.metadata["connection"]:
            _setting_flag(p, name)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jms-bridge", description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"jms-bridge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = commands.add_parser("run", help="run the bridge in front of a broker")
    _connection_flags(run)
    for name, f in SETTINGS.items():
        if f.metadata["flag"] and not f.metadata["connection"]:
            _setting_flag(run, name)
    staged = commands.add_parser("staged", help="list, count, cancel or release staged messages")
    actions = staged.add_subparsers(dest="action", required=True, parser_class=_Parser)
    listing = actions.add_parser("list", help="staged messages, soonest first")
    counting = actions.add_parser("count", help="how many messages are staged")
    for p in (listing, counting):
        _connection_flags(p)
        p.add_argument("--target", metavar="DEST", help="only those sent to DEST")
    listing.add_argument("--message-id", metavar="ID", help="only the one with this id")
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    for p in (listing, counting):
        _scan_flag(p)
        _selector_flag(p)
    for name, what in (("cancel", "never deliver it"), ("release", "deliver it now"),
                       ("reschedule", "move its due time (--in or --at)")):
        p = actions.add_parser(
            name, help=f"find a staged message by its original id (or --selector) and {what}")
        _connection_flags(p)
        p.add_argument("message_id", metavar="ID", nargs="?")
        _selector_flag(p)
        if name == "cancel":
            _scan_flag(p)
        if name == "reschedule":
            when = p.add_mutually_exclusive_group(required=True)
            when.add_argument("--in", dest="due_in", metavar="DURATION",
                              help="due this long from now: 90s, 10m, 2h, 1d")
            when.add_argument("--at", dest="due_at", metavar="TIME",
                              help="due then: ISO 8601 (UTC unless it says) or epoch ms")
        _setting_flag(p, "journal",
                      help="journal what this tool does itself here when no staging engine "
                           "runs (the bridge's journal folder); a running engine journals "
                           "it otherwise")
    policy = commands.add_parser("policy", help="which redelivery policy applies, and what it does")
    policy_actions = policy.add_subparsers(dest="action", required=True, parser_class=_Parser)
    show = policy_actions.add_parser(
        "show", help="the policy for a destination and its action for each failed delivery")
    show.add_argument("--config", metavar="FILE", help="YAML file of settings (flag names as keys)")
    show.add_argument("destination", metavar="DEST", help="a destination: /queue/orders.eu")
    show.add_argument("--user", metavar="USER", help="as this user's own policies see it")
    show.add_argument("--upto", metavar="N", type=int, default=None,
                      help="show failures 1..N (default: until the policy settles)")
    show.add_argument("--json", action="store_true", help="JSON instead of text")
    _setting_flag(show, "broker")
    _setting_flag(show, "upstream-amqp",
                  help="RabbitMQ: the vhost of the queue whose arguments are read")
    _setting_flag(show, "upstream-management",
                  help="RabbitMQ's management API: read the queue's own delayed-retry "
                           "arguments, which win over the configured patterns")
    dlq_args.add_parser(commands, _connection_flags, _Parser)
    report = commands.add_parser(
        "report", help="per destination and hour, from the event journal: Parquet tables and an "
                       "HTML page of charts (PySpark)")
    add_report_arguments(report)
    replay = commands.add_parser(
        "replay", help="put the messages of a dead-letter archive that a selector matches back "
                       "where they were going, once each (PySpark)")
    _connection_flags(replay)
    add_replay_arguments(replay)
    return parser


def _selector_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--selector", metavar="EXPR",
                        help="only the messages this JMS selector selects, over their own "
                             "headers and properties: \"orderId = 42 AND region = 'EU'\"")


def _scan_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scan", action="store_true",
                        help="read the staging queues even where every running bridge keeps a "
                             "staged catalogue (slow with millions pending)")


def _policy(ns: argparse.Namespace, settings: Settings) -> int:
    """``jms-bridge policy show``: what a configuration does before anyone relies on it."""
    from bridge.app.policy_report import policy_report, render_policy
    from bridge.app.queue_policies import declared_policies

    if ns.upto is not None and not 1 <= ns.upto <= 1000:
        raise ConfigError(f"--upto: expected 1 to 1000, got {ns.upto}")
    report = policy_report(settings.redelivery, ns.destination, user=ns.user, upto=ns.upto,
                           declared=declared_policies(settings))
    print(render_policy(report, as_json=ns.json))
    return 0


EXIT_NOT_FOUND = 3


def _staged(ns: argparse.Namespace, settings: Settings) -> int:
    from bridge.app.brokers import staging_broker
    from bridge.staging import listing, operations
    from bridge.staging.levels import layout_for

    broker = staging_broker(settings)
    layout = layout_for(broker.format, settings.staging_prefix)
    broker.connect()
    try:
        warnings: list[str] = []
        if ns.action == "count" and ns.target is None and ns.selector is None:
            print(listing.count(broker, layout, warnings=warnings))
            for warning in warnings:
                print(warning, file=sys.stderr)
            return 0
        if ns.action in ("list", "count"):
            unseen: dict[str, tuple[int, int]] = {}
            rows = listing.rows(broker, layout, target=ns.target,
                              message_id=getattr(ns, "message_id", None), unseen=unseen,
                              scan=ns.scan, selector=ns.selector, warnings=warnings)
            found = _read(rows, broker, layout, quiet=getattr(ns, "json", False))
            if found is None:
                return EXIT_INTERRUPTED
            if unseen:
                print(listing.unseen_warning(unseen), file=sys.stderr)
            for warning in warnings:
                print(warning, file=sys.stderr)
            if ns.action == "count":
                print(len(found))
            else:
                print(listing.render(found, as_json=ns.json))
            return 0
        if ns.selector is not None:
            return _staged_selected(ns, settings, broker, layout)
        try:
            outcome = _act(ns, broker, layout, ns.message_id)
        except operations.Busy as busy:
            print(f"jms-bridge: {busy}", file=sys.stderr)
            return EXIT_FAILURE
        if outcome is None:
            print(operations.NOT_FOUND.format(ns.message_id))
            if broker.sees_held:  # ActiveMQ: were there messages it would not show?
                unseen = {}
                for _ in listing.rows(broker, layout, message_id=ns.message_id, unseen=unseen):
                    pass
                if unseen:
                    print(listing.unseen_warning(unseen), file=sys.stderr)
            return EXIT_NOT_FOUND
        _journal_outcome(ns, settings, outcome)
        print(outcome.describe(ns.message_id))
        return 0 if outcome.as_asked else EXIT_FAILURE
    finally:
        broker.close()


def _check_staged(ns: argparse.Namespace) -> None:
    """Usage a parser cannot say: an id or a selector, and a selector that parses."""
    if ns.action == "reschedule":
        import time

        from policies.when import due_at, due_in

        now = time.time_ns() // 1_000_000
        ns.due_ms = due_in(ns.due_in, now) if ns.due_in is not None else due_at(ns.due_at, now)
    if ns.action in ("cancel", "release", "reschedule"):
        if (ns.message_id is None) == (ns.selector is None):
            raise ConfigError(f"staged {ns.action}: give a message ID or --selector (one of them)")
    if getattr(ns, "selector", None) is not None:
        from policies.selector import parse

        if not ns.selector.strip():
            raise ConfigError("--selector: an empty selector (to act on every message, list "
                              "them first)")
        parse(ns.selector)  # InvalidSelector (a ConfigError) naming the column


def _staged_selected(ns: argparse.Namespace, settings: Settings, broker: StagingBroker,
                     layout: Layout) -> int:
    """``staged cancel|release --selector``: each staged message it selects, and how many."""
    from bridge.staging import listing, operations

    found = list(listing.rows(broker, layout, selector=ns.selector,
                            scan=getattr(ns, "scan", False)))
    done = failed = 0
    for row in found:
        try:
            outcome = _act(ns, broker, layout, row.message_id)
        except (operations.Busy, Refused) as error:  # the others are still worth doing
            print(f"jms-bridge: {error}", file=sys.stderr)
            failed += 1
            continue
        if outcome is None:  # released or cancelled meanwhile
            print(operations.NOT_FOUND.format(row.message_id))
            failed += 1
            continue
        _journal_outcome(ns, settings, outcome)
        print(outcome.describe(row.message_id))
        if outcome.as_asked:
            done += 1
        else:
            failed += 1
    verb = {"cancel": "cancelled", "release": "released", "reschedule": "rescheduled"}[ns.action]
    print(f"{verb} {done} of the {len(found)} staged message(s) the selector selects")
    return 0 if failed == 0 else EXIT_FAILURE


def _act(ns: argparse.Namespace, broker: StagingBroker, layout: Layout,
         message_id: str) -> OrderOutcome | None:
    from bridge.staging import operations

    if ns.action == "cancel":
        return operations.cancel(broker, layout, message_id, scan=ns.scan)
    if ns.action == "release":
        return operations.release_now(broker, layout, message_id)
    return operations.reschedule(broker, layout, message_id, ns.due_ms)


def _journal_outcome(ns: argparse.Namespace, settings: Settings, outcome: OrderOutcome) -> None:
    """The event of what the tool did itself: a running engine took its note and journals it;
    else this tool journals it where --journal says, or says that nobody did."""
    if outcome.staged is None or outcome.noted:
        return
    from bridge.app.journal import journal_tool
    from bridge.staging.outcomes import Kind

    kind = {"cancel": Kind.CANCELLED, "release": Kind.RELEASED_NOW,
            "reschedule": Kind.RESCHEDULED}[ns.action]
    if settings.journal is None:
        print("journal: no staging engine is running to journal this; not journaled (give "
              "--journal DIR to journal it from this tool)", file=sys.stderr)
        return
    journal_tool(settings, kind, outcome.staged, due_ms=outcome.due_ms)
    print(f"journal: journaled by this tool in {settings.journal} (no staging engine is "
          "running)", file=sys.stderr)


def _read(rows: Iterator[Row], broker: StagingBroker, layout: Layout, *,
          quiet: bool) -> list[Row] | None:
    """The rows, with a progress bar on a terminal; None when Ctrl-C stopped the reading (one
    line says how far it got)."""
    from bridge.app.progress import Progress, interrupted_line, interruptible

    try:
        total: int | None = sum(broker.depths(layout.queues).values())
    except BridgeError:  # a user the broker's statistics are not for: a count, no estimate
        total = None
    found: list[Row] = []
    with interruptible() as stop, Progress("staged", total, quiet=quiet) as progress:
        for row in rows:
            found.append(row)
            progress.advance()
            if stop():
                print(interrupted_line(len(found), total, "read", "nothing was changed"),
                      file=sys.stderr)
                return None
    return found


def _report(ns: argparse.Namespace) -> int:
    try:
        from bridge.pipeline.report import main_with
        from bridge.pipeline.watch import Interrupted
    except ImportError as exc:
        print(f"jms-bridge: report needs PySpark (pip install 'jms-bridge[pipeline]'): {exc}",
              file=sys.stderr)
        return EXIT_FAILURE
    try:
        return main_with(ns, _tasks_bar("report"))
    except BridgeError as exc:  # a journal not there, Spark's own failure: in one line
        print(f"jms-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except Interrupted as stopped:
        print(stopped.line, file=sys.stderr)
        return EXIT_INTERRUPTED


def _tasks_bar(what: str) -> Callable[[], Progress]:
    """A Spark job's progress bar (on a terminal only), made once Spark has started: its
    tasks are the unit, as the job counts nothing else while it runs."""
    from bridge.app.progress import Progress

    return lambda: Progress(what, None, unit=" tasks")


def _replay(ns: argparse.Namespace, settings: Settings) -> int:
    try:
        from bridge.pipeline.replay import main_with
        from bridge.pipeline.watch import Interrupted
    except ImportError as exc:
        print(f"jms-bridge: replay needs PySpark (pip install 'jms-bridge[pipeline]'): {exc}",
              file=sys.stderr)
        return EXIT_FAILURE
    from bridge.app.config import bridge_amqp, bridge_stomp

    try:
        if settings.broker == "rabbitmq":
            return main_with(ns, "rabbitmq", bridge_amqp(settings),
                             settings.upstream_management, _tasks_bar("replay"))
        return main_with(ns, "activemq", bridge_stomp(settings), None, _tasks_bar("replay"))
    except Interrupted as stopped:
        print(stopped.line, file=sys.stderr)
        return EXIT_INTERRUPTED


def _settings_flags(ns: argparse.Namespace) -> dict[str, object]:
    flags = {k.replace("_", "-"): v for k, v in vars(ns).items()}
    return {k: v for k, v in flags.items() if k in SETTING_NAMES}


EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command a closed pipe stopped


def main(argv: Sequence[str] | None = None) -> int:
    """The command; a reader that went away (``| head``) ends it quietly, whatever it prints."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # what is still buffered is written here, not at interpreter exit
    except BrokenPipeError:
        # Nothing more can reach the reader. Point stdout at /dev/null so that the flush at
        # exit does not fail again ("Exception ignored ... BrokenPipeError").
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return EXIT_PIPE
    except KeyboardInterrupt:  # report runs outside _main's handlers: no traceback either
        print("jms-bridge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


def _main(argv: Sequence[str] | None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.command == "report":  # needs no bridge settings
        return _report(ns)
    try:
        settings = resolve(_settings_flags(ns), config_file=ns.config)
        logs.configure(settings.log_format, settings.log_level)
        if ns.command == "run":
            import asyncio

            from bridge.app.serve import serve

            asyncio.run(serve(settings))
            return 0
        if ns.command == "policy":
            return _policy(ns, settings)
        if ns.command == "dlq":
            from bridge.app import dlq

            return dlq.run(ns, settings)
        if ns.command == "replay":
            return _replay(ns, settings)
        _check_staged(ns)
        return _staged(ns, settings)
    except BrokerUnavailable as exc:
        print(f"jms-bridge: {exc.with_reason()}", file=sys.stderr)
        return EXIT_FAILURE
    except BridgeError as exc:
        print(f"jms-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        if ns.command != "run":  # a tool stopped at once (a second Ctrl-C)
            print("jms-bridge: interrupted; what the broker had committed stays done",
                  file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
