"""structlog set-up: JSON lines in production, readable lines on a terminal, to stderr.

The libraries' own standard-library logs (aiohttp's: the admin API's server) go through the same
renderer, one line each: aiohttp logs a request it cannot parse (a malformed request line, a
byte that is not allowed in a URL) with the parser's traceback, and the client has its 400
already, so the line names the error instead."""

from __future__ import annotations

import logging
import sys

import structlog

from bridge.app.progress import Stderr


def configure(fmt: str = "console", level: str = "info") -> None:
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.handlers = [_OneLine()]
        library.propagate = False
        library.setLevel(logging.getLevelNamesMapping()[level.upper()])


LIBRARY_LOGGERS = ("aiohttp",)


class _OneLine(logging.Handler):
    """A standard-library record as one structlog line: its message, and the exception's own
    words where it carries one (not its traceback)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            context: dict[str, object] = {}
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                context["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            structlog.get_logger(record.name).log(record.levelno, record.getMessage(), **context)
        except Exception:  # noqa: BLE001 - a log line must not take the server down
            self.handleError(record)


def get(name: str, **context: object) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name).bind(**context)  # type: ignore[no-any-return]
