"""``jms-bridge dlq export``: dead letters written to files, every header and the body.

A file appears under its final name only when it is complete: written as ``.<name>.tmp`` in
the same folder, fsynced, renamed, and the folder fsynced. With ``--remove`` each batch of
messages is written to its own file first and removed from the queue (one broker transaction)
only after that file is on disk; a kill in between leaves the messages on the queue and the
file too, so a rerun exports them again (readers may drop repeats by ``queue``+``broker_id``,
or by ``original_id``).

Row schema (version 1), the same in both formats:

    schema                int     1
    queue                 string  the queue exported from
    broker                string  rabbitmq | activemq
    broker_id             string  the broker's id of the message on that queue ('' if none)
    position              int     its place on the queue when exported (0 = head)
    exported_at_ms        long    epoch ms
    original_id           string  the application's message id
    kind                  string  bridge | staged | activemq | rabbitmq | plain
    reason                string? MQRC/MQFB name (or the broker's word)
    reason_code           int?
    reason_text           string?
    original_destination  string? STOMP form: /queue/orders, /amq/queue/orders
    failed_at_ms          long?
    delivery_count        int?
    persistent            bool
    headers               map<string,string> (JSON lines: an object)
    body                  bytes   (JSON lines: ``body_base64``, standard base64)

JSON lines files are ``*.jsonl``, one object a line, UTF-8; Parquet files ``*.parquet``
(pyarrow, zstd).
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adapters.queues import Visit
from bridge.deadletter import metadata
from policies.errors import ConfigError

SCHEMA_VERSION = 1
FORMATS = ("jsonl", "parquet")


def row(queue: str, broker: str, broker_id: str, position: int, headers: dict[str, str],
        body: bytes, *, now_ms: int) -> dict[str, Any]:
    info = metadata.describe(headers, broker_id)
    return {
        "schema": SCHEMA_VERSION, "queue": queue, "broker": broker, "broker_id": broker_id,
        "position": position, "exported_at_ms": now_ms, "original_id": info.original_id,
        "kind": info.kind, "reason": info.reason, "reason_code": info.reason_code,
        "reason_text": info.reason_text, "original_destination": info.original_destination,
        "failed_at_ms": info.failed_at_ms, "delivery_count": info.delivery_count,
        "persistent": info.persistent, "headers": dict(headers), "body": body,
    }


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


@dataclass
class Writer:
    """Writes rows to complete files in ``folder``."""

    folder: Path
    queue: str
    fmt: str = "jsonl"
    files: list[Path] = field(default_factory=list)
    rows: int = 0
    _seq: int = 0

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ConfigError(f"--format: expected one of {', '.join(FORMATS)}, got {self.fmt!r}")
        if self.fmt == "parquet":
            try:
                import pyarrow  # type: ignore[import-untyped]  # noqa: F401
            except ImportError:
                raise ConfigError("--format parquet needs pyarrow (pip install "
                                  "'jms-bridge[pipeline]'); --format jsonl needs nothing"
                                  ) from None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--to {self.folder}: cannot make the folder: {exc}") from None
        if not os.access(self.folder, os.W_OK):
            raise ConfigError(f"--to {self.folder}: not writable")
        self._stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())

    def write(self, rows: Sequence[dict[str, Any]]) -> Path | None:
        """One complete file holding ``rows``; None when there are none."""
        if not rows:
            return None
        self._seq += 1
        name = f"{_safe(self.queue)}-{self._stamp}-{os.getpid()}-{self._seq:05d}.{self.fmt}"
        final = self.folder / name
        temp = self.folder / f".{name}.tmp"
        try:
            if self.fmt == "jsonl":
                self._jsonl(temp, rows)
            else:
                self._parquet(temp, rows)
            os.replace(temp, final)
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            temp.unlink(missing_ok=True)
            raise ConfigError(f"--to {self.folder}: cannot write {name}: {exc}") from None
        self.files.append(final)
        self.rows += len(rows)
        return final

    @staticmethod
    def _jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
        with open(path, "wb") as out:
            for r in rows:
                record = {k: v for k, v in r.items() if k != "body"}
                record["body_base64"] = base64.b64encode(r["body"]).decode("ascii")
                out.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")
            out.flush()
            os.fsync(out.fileno())

    @staticmethod
    def _parquet(path: Path, rows: Sequence[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        schema = pa.schema([
            ("schema", pa.int32()), ("queue", pa.string()), ("broker", pa.string()),
            ("broker_id", pa.string()), ("position", pa.int64()),
            ("exported_at_ms", pa.int64()), ("original_id", pa.string()),
            ("kind", pa.string()), ("reason", pa.string()), ("reason_code", pa.int32()),
            ("reason_text", pa.string()), ("original_destination", pa.string()),
            ("failed_at_ms", pa.int64()), ("delivery_count", pa.int32()),
            ("persistent", pa.bool_()), ("headers", pa.map_(pa.string(), pa.string())),
            ("body", pa.binary()),
        ])
        columns = {name: [r[name] if name != "headers" else list(r["headers"].items())
                          for r in rows] for name in schema.names}
        table = pa.table(columns, schema=schema)
        with open(path, "wb") as out:
            pq.write_table(table, out, compression="zstd")
            out.flush()
            os.fsync(out.fileno())


def visit_rows(queue: str, broker: str, visits: Sequence[Visit]) -> list[dict[str, Any]]:
    now = time.time_ns() // 1_000_000
    return [row(queue, broker, v.found.broker_id, v.found.position,
                dict(v.found.message.headers), v.found.message.body, now_ms=now)
            for v in visits]
