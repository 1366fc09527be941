"""The ``jms-bridge`` command.

Every failure a person can cause (a bad flag, a broken config file, a broker that is not
there) ends with one line on stderr naming the problem and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from bridge import __version__
from bridge.app import dlq, logs
from bridge.app.config import BROKERS, LOG_FORMATS, LOG_LEVELS, Settings, resolve
from bridge.pipeline.options import add_arguments as add_report_arguments
from bridge.pipeline.options import add_replay_arguments
from policies.errors import BridgeError, BrokerUnavailable, ConfigError

EXIT_USAGE = 2
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (flag names as keys)")
    p.add_argument("--broker", choices=BROKERS, default=None)
    p.add_argument("--upstream-stomp", metavar="stomp://[USER:PASS@]HOST:PORT")
    p.add_argument("--upstream-amqp", metavar="amqp://USER:PASS@HOST:PORT/VHOST")
    p.add_argument("--upstream-management", metavar="http://USER:PASS@HOST:PORT",
                   help="RabbitMQ's management API, to see queue length limits (optional)")
    p.add_argument("--upstream-ca", metavar="FILE",
                   help="CA file to verify a stomp+ssl:// or amqps:// broker against")
    p.add_argument("--log-format", choices=LOG_FORMATS, default=None)
    p.add_argument("--log-level", choices=LOG_LEVELS, default=None, type=str.lower)
    p.add_argument("--staging-prefix", metavar="NAME", help="name prefix of the staging queues")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="jms-bridge", description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"jms-bridge {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = commands.add_parser("run", help="run the bridge in front of a broker")
    _connection_flags(run)
    run.add_argument("--stomp-listen", metavar="HOST:PORT")
    run.add_argument("--admin-listen", metavar="HOST:PORT")
    run.add_argument("--amqp-listen", metavar="HOST:PORT",
                     help="accept AMQP 0-9-1 clients here (RabbitMQ only; off unless given)")
    run.add_argument("--staging-engine", metavar="on|off",
                     help="release staged messages in this process (off: only stage them)")
    run.add_argument("--staging-level-prefetch", metavar="N",
                     help="messages taken ahead from each short level queue (default 1000)")
    run.add_argument("--staging-queue-type", metavar="classic|quorum",
                     help="type of the staging queues: quorum replicates them on a RabbitMQ "
                          "cluster (RabbitMQ only; default classic)")
    run.add_argument("--delay-headers", metavar="NAMES",
                     help="comma-separated headers holding a relative delay in ms")
    run.add_argument("--delivery-time-headers", metavar="NAMES",
                     help="comma-separated headers holding an absolute delivery time (epoch ms)")
    run.add_argument("--delay-disabled", metavar="PATTERNS",
                     help="comma-separated destination patterns that may not be delayed")
    run.add_argument("--activemq-scheduler", metavar="take|passthrough",
                     help="AMQ_SCHEDULED_* headers: staged by the bridge (take, the default) "
                          "or left to ActiveMQ's own scheduler (passthrough; ActiveMQ only)")
    run.add_argument("--first-delivery-count", metavar="PATTERNS",
                     help="comma-separated destination patterns whose first deliveries carry "
                          "JMSXDeliveryCount 1 too (elsewhere only redeliveries carry it)")
    run.add_argument("--handshake-timeout", metavar="SECONDS",
                     help="close a client that has not sent a whole CONNECT by then (default 10)")
    run.add_argument("--max-connections", metavar="N",
                     help="client connections at once (default 10000)")
    run.add_argument("--max-connections-per-address", metavar="N",
                     help="client connections at once from one address (default 1000)")
    run.add_argument("--stomp-tls-listen", metavar="HOST:PORT",
                     help="accept STOMP clients over TLS here (needs --tls-cert, --tls-key)")
    run.add_argument("--amqp-tls-listen", metavar="HOST:PORT",
                     help="accept AMQP 0-9-1 clients over TLS here, as RabbitMQ's amqps port "
                          "(RabbitMQ only; needs --tls-cert, --tls-key)")
    run.add_argument("--tls-cert", metavar="FILE", help="the TLS listeners' certificate (PEM)")
    run.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    run.add_argument("--tls-client-ca", metavar="FILE",
                     help="ask clients for a certificate signed by this CA (mutual TLS)")
    run.add_argument("--max-frame-bytes", metavar="SIZE",
                     help="largest STOMP frame a client may send (default 64MiB)")
    run.add_argument("--max-buffered-bytes", metavar="SIZE",
                     help="bytes held for all clients together before the bridge stops "
                          "reading them (default 128MiB)")
    run.add_argument("--upstream-wait", metavar="SECONDS",
                     help="exit 1 if the broker does not answer within SECONDS of start "
                          "(default: start anyway and connect when it comes)")
    run.add_argument("--undelivered-queue", metavar="NAME",
                     help="where failed deliveries go when their policy says undelivered "
                          "(default jms-bridge.undelivered)")
    run.add_argument("--expiry-policy", metavar="REGEX|off",
                     help="RabbitMQ: apply a policy (lowest priority, needs "
                          "--upstream-management) that dead-letters the expired messages of "
                          "the queues whose names match REGEX to the bridge, which keeps those "
                          "that asked to be (JMS_TIBCO_PRESERVE_UNDELIVERED) on the undelivered "
                          "queue (default off)")
    run.add_argument("--expiry-dead-letter-queue", metavar="NAME|off",
                     help="ActiveMQ: the dead-letter queue the broker moves expired messages "
                          "to, from which the bridge takes those that asked to be kept to the "
                          "undelivered queue (default ActiveMQ.DLQ; DLQ.> for "
                          "per-destination dead-letter queues)")
    run.add_argument("--message-retry", metavar="COUNT:INTERVAL_MS",
                     help="retries of a release its target refused for a reason that can pass "
                          "(queue full), and the wait between them (default 10:1000)")
    run.add_argument("--admin-token-file", metavar="FILE",
                     help="bearer token(s) the admin API asks for, one a line (re-read when "
                          "the file changes); without it the /staged endpoints are refused")
    run.add_argument("--journal", metavar="DIR",
                     help="write every message's events as JSON lines to files in DIR (off "
                          "unless given)")
    run.add_argument("--staged-catalogue", metavar="FILE",
                     help="index the messages this bridge stages in this SQLite file, so that "
                          "`staged list` and `cancel` answer without reading the staging "
                          "queues (off unless given)")
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
    for name, what in (("cancel", "never deliver it"), ("release", "deliver it now")):
        p = actions.add_parser(name, help=f"find a staged message by its original id and {what}")
        _connection_flags(p)
        p.add_argument("message_id", metavar="ID")
        if name == "cancel":
            _scan_flag(p)
        p.add_argument("--journal", metavar="DIR",
                       help="journal what this tool does itself here (the bridge's journal "
                            "folder; an engine that holds the message journals it there)")
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
    dlq.add_parser(commands, _connection_flags, _Parser)
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


def _scan_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scan", action="store_true",
                        help="read the staging queues even where every running bridge keeps a "
                             "staged catalogue (slow with millions pending)")


def _policy(ns: argparse.Namespace, settings: Settings) -> int:
    """``jms-bridge policy show``: what a configuration does before anyone relies on it."""
    from bridge.app.policies import policy_report, render_policy

    if ns.upto is not None and not 1 <= ns.upto <= 1000:
        raise ConfigError(f"--upto: expected 1 to 1000, got {ns.upto}")
    report = policy_report(settings.redelivery, ns.destination, user=ns.user, upto=ns.upto)
    print(render_policy(report, as_json=ns.json))
    return 0


EXIT_NOT_FOUND = 3


def _staged(ns: argparse.Namespace, settings: Settings) -> int:
    from adapters import speedups
    from bridge.app.brokers import staging_broker
    from bridge.staging import tools
    from bridge.staging.levels import layout_for

    # The tools browse every staging queue: the adapters' library speed-ups pay here too.
    speedups.install()
    broker = staging_broker(settings)
    layout = layout_for(broker.format, settings.staging_prefix)
    broker.connect()
    try:
        if ns.action == "count" and ns.target is None:
            print(tools.count(broker, layout))
            return 0
        if ns.action in ("list", "count"):
            unseen: dict[str, tuple[int, int]] = {}
            found = list(tools.rows(broker, layout, target=ns.target,
                                    message_id=getattr(ns, "message_id", None), unseen=unseen,
                                    scan=ns.scan))
            if unseen:
                print(tools.unseen_warning(unseen), file=sys.stderr)
            if ns.action == "count":
                print(len(found))
            else:
                print(tools.render(found, as_json=ns.json))
            return 0
        if ns.action == "cancel":
            outcome = tools.cancel(broker, layout, ns.message_id, scan=ns.scan)
        else:
            outcome = tools.release_now(broker, layout, ns.message_id)
        if outcome is None:
            print(tools.NOT_FOUND.format(ns.message_id))
            if broker.sees_held:  # ActiveMQ: were there messages it would not show?
                unseen = {}
                for _ in tools.rows(broker, layout, message_id=ns.message_id, unseen=unseen):
                    pass
                if unseen:
                    print(tools.unseen_warning(unseen), file=sys.stderr)
            return EXIT_NOT_FOUND
        if outcome.staged is not None:
            from bridge.app.journal import journal_tool
            from bridge.staging.outcomes import Kind

            kind = Kind.CANCELLED if ns.action == "cancel" else Kind.RELEASED_NOW
            journal_tool(settings, kind, outcome.staged)
        print(outcome.describe(ns.message_id))
        return 0 if outcome.as_asked else EXIT_FAILURE
    finally:
        broker.close()


def _report(ns: argparse.Namespace) -> int:
    try:
        from bridge.pipeline.report import main_with
    except ImportError as exc:
        print(f"jms-bridge: report needs PySpark (pip install 'jms-bridge[pipeline]'): {exc}",
              file=sys.stderr)
        return EXIT_FAILURE
    try:
        return main_with(ns)
    except BridgeError as exc:  # a journal not there, Spark's own failure: in one line
        print(f"jms-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _replay(ns: argparse.Namespace, settings: Settings) -> int:
    try:
        from bridge.pipeline.replay import main_with
    except ImportError as exc:
        print(f"jms-bridge: replay needs PySpark (pip install 'jms-bridge[pipeline]'): {exc}",
              file=sys.stderr)
        return EXIT_FAILURE
    from bridge.app.config import bridge_amqp, bridge_stomp

    if settings.broker == "rabbitmq":
        return main_with(ns, "rabbitmq", bridge_amqp(settings), settings.upstream_management)
    return main_with(ns, "activemq", bridge_stomp(settings), None)


def _settings_flags(ns: argparse.Namespace) -> dict[str, object]:
    skip = {"command", "config", "action", "target", "message_id", "json", "scan", "destination",
            "user",
            "upto", "archive", "rate", "ledger", "partitions", "out", "master", *dlq.OWN_KEYS}
    return {k.replace("_", "-"): v for k, v in vars(ns).items() if k not in skip}


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
    return code


def _main(argv: Sequence[str] | None) -> int:
    ns = build_parser().parse_args(argv)
    if ns.command == "report":  # needs no bridge settings
        return _report(ns)
    try:
        settings = resolve(_settings_flags(ns), config_file=ns.config)
        logs.configure(settings.log_format, settings.log_level)
        if ns.command == "run":
            from bridge.app.serve import serve

            asyncio.run(serve(settings))
            return 0
        if ns.command == "policy":
            return _policy(ns, settings)
        if ns.command == "dlq":
            return dlq.run(ns, settings)
        if ns.command == "replay":
            return _replay(ns, settings)
        return _staged(ns, settings)
    except BrokerUnavailable as exc:
        print(f"jms-bridge: {exc.with_reason()}", file=sys.stderr)
        return EXIT_FAILURE
    except BridgeError as exc:
        print(f"jms-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
