"""The ``jms-bridge dlq`` subcommands' arguments: what the command line needs before it knows
which command runs (``bridge.app.dlq`` runs them, and is imported only then)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from bridge.deadletter.archive import FORMATS

ACTIONS = ("list", "count", "browse", "purge", "replay", "move", "export", "handle")


def add_parser(
    commands: argparse._SubParsersAction,  # type: ignore[type-arg]
    connection_flags: Callable[[argparse.ArgumentParser], None],
    parser_class: type[argparse.ArgumentParser],
) -> None:
    dlq = commands.add_parser(
        "dlq", help="list, browse, purge, replay, move, export or handle dead letters")
    actions = dlq.add_subparsers(dest="action", required=True, parser_class=parser_class)
    helps = {
        "list": "dead-letter queues (by name, and any --queue) with their message counts",
        "count": "how many messages of a queue match",
        "browse": "matching messages' metadata (reason, original destination, time, "
                  "deliveries, original id), optionally the body",
        "purge": "remove the matching messages",
        "replay": "put the matching messages back to their original destination (or --to), "
                  "as the application sent them",
        "move": "put the matching messages to --to, dead-letter metadata kept",
        "export": "write the matching messages (every header and the body) to files in --to",
        "handle": "apply a runmqdlq-style rules table to a dead-letter queue",
    }
    for name in ACTIONS:
        p = actions.add_parser(name, help=helps[name])
        connection_flags(p)
        if name == "list":
            p.add_argument("--queue", metavar="Q", action="append",
                           help="show this queue too (repeatable)")
        elif name == "handle":
            p.add_argument("--queue", metavar="Q",
                           help="the queue to handle (default: the rules' INPUTQ, else the "
                                "undelivered queue)")
        else:
            p.add_argument("--queue", metavar="Q",
                           help="the queue (default: the undelivered queue)")
        if name not in ("list", "handle"):
            p.add_argument("--selector", metavar="EXPR",
                           help="a JMS selector; JMSDestination='Queue[A]' is the original "
                                "destination")
        if name in ("browse", "purge", "replay", "move", "export"):
            p.add_argument("--limit", metavar="N", type=int, default=None,
                           help="at most N matching messages")
        if name in ("list", "browse", "purge", "replay", "move"):
            p.add_argument("--json", action="store_true", help="JSON instead of text")
    actions.choices["browse"].add_argument("--body", action="store_true",
                                           help="show each message's body too")
    actions.choices["purge"].add_argument(
        "--all", action="store_true", help="purge every message (without --selector, needed)")
    actions.choices["replay"].add_argument(
        "--to", metavar="DEST", help="put them here instead of their original destination")
    actions.choices["move"].add_argument("--to", metavar="DEST", required=True,
                                         help="where they go (/queue/NAME or a queue name)")
    export = actions.choices["export"]
    export.add_argument("--to", metavar="DIR", required=True, help="folder for the files")
    export.add_argument("--remove", action="store_true",
                        help="remove each message once the file holding it is on disk")
    export.add_argument("--format", choices=FORMATS, default="jsonl")
    handle = actions.choices["handle"]
    handle.add_argument("--rules", metavar="FILE", required=True, help="the rules table")
    handle.add_argument("--once", action="store_true",
                        help="one pass over the queue, then exit")
    handle.add_argument("--metrics-listen", metavar="HOST:PORT",
                        help="serve the handler's counters for Prometheus here (/metrics)")


__all__ = ["ACTIONS", "add_parser"]
