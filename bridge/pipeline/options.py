"""The report's command-line options, without importing Spark (``jms-bridge --help`` stays
quick, and works where the ``pipeline`` extra is not installed)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime


def parse_time(value: str) -> int:
    """Epoch ms, or an ISO 8601 date or time (UTC unless it says otherwise)."""
    text = value.strip()
    if text.isascii() and text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected epoch ms or an ISO 8601 time, got {value!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def spark_setting(value: str) -> tuple[str, str]:
    """``KEY=VALUE``, as spark-submit's ``--conf`` takes it."""
    key, sep, setting = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key.strip(), setting


def add_spark_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", metavar="URL",
                   help="Spark master (default: embedded local[*], or spark-submit's own)")
    p.add_argument("--conf", metavar="KEY=VALUE", type=spark_setting, action="append",
                   default=[], help="a Spark setting, as spark-submit's --conf (repeatable)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--journal", metavar="PATH", required=True, action="append",
                   help="journal folder, file or glob, any URI Spark reads (repeatable)")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="where the Parquet tables and report.html go")
    p.add_argument("--since", metavar="T", type=parse_time,
                   help="from this time (epoch ms or ISO 8601, UTC by default)")
    p.add_argument("--until", metavar="T", type=parse_time, help="up to this time (excluded)")
    add_spark_arguments(p)


def add_replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--archive", metavar="PATH", required=True, action="append",
                   help="a dead-letter archive (dlq export's folder or file; Parquet or JSON "
                        "lines), any URI Spark reads (repeatable)")
    p.add_argument("--selector", metavar="EXPR",
                   help="a JMS selector; JMSDestination='Queue[A]' is the original destination")
    p.add_argument("--to", metavar="DEST",
                   help="put them here instead of their original destinations")
    p.add_argument("--rate", metavar="N", type=float, default=None,
                   help="at most N messages a second overall")
    p.add_argument("--ledger", metavar="NAME",
                   help="the ledger's name (default: a digest of --archive and --to: every "
                        "replay of one archive to one target skips what another put back)")
    p.add_argument("--partitions", metavar="N", type=int, default=None,
                   help="how many partitions publish at once (default: Spark's parallelism)")
    p.add_argument("--batch", metavar="N", type=int, default=500,
                   help="messages per broker transaction (default 500)")
    p.add_argument("--out", metavar="DIR", help="also write summary.json here")
    add_spark_arguments(p)
