"""The report's HTML page: plotly charts and the main tables, in one file that needs nothing
else (plotly's script is inlined once)."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go  # type: ignore[import-untyped]
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

TABLE_ROWS = 200
TOP_REASONS = 20
EVENT_ORDER = ("staged", "released", "released-now", "refused", "expired", "cancelled",
               "undeliverable", "invalid", "redelivered", "dead-lettered", "undelivered",
               "deleted", "reported")


def _when(ms: int | None) -> str:
    if ms is None:
        return "…"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(df: DataFrame, title: str, note: str = "") -> str:
    rows = df.limit(TABLE_ROWS + 1).collect()
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = []
    for row in rows[:TABLE_ROWS]:
        cells = []
        for value in row:
            if isinstance(value, float):
                text = f"{value:,.2f}"
            elif isinstance(value, int):
                text = f"{value:,}"
            elif isinstance(value, datetime):
                text = value.strftime("%Y-%m-%d %H:00")
            else:
                text = "" if value is None else str(value)
            cells.append(f"<td>{html.escape(text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = (f"<p class=note>First {TABLE_ROWS} rows; all of them are in the Parquet table.</p>"
            if len(rows) > TABLE_ROWS else "")
    if not rows:
        return f"<h2>{html.escape(title)}</h2><p class=note>None.</p>"
    return (f"<h2>{html.escape(title)}</h2>{note}<table><tr>{head}</tr>{''.join(body)}</table>"
            f"{more}")


def _figure(fig: go.Figure, first: bool) -> str:
    fig.update_layout(template="plotly_white", height=420, margin={"l": 60, "r": 20, "t": 50})
    out: str = fig.to_html(full_html=False, include_plotlyjs=True if first else False)
    return out


def render(tables: dict[str, DataFrame], *, events: int, since_ms: int | None,
           until_ms: int | None, bucket_order: list[str]) -> str:
    """The page, from the tables ``bridge.pipeline.report`` wrote (``bucket_order``: its
    lateness bucket labels, earliest first)."""
    charts: list[str] = []

    buckets = {r["bucket"]: r["released"] for r in tables["lateness_buckets"].collect()}
    order = [b for b in bucket_order if b in buckets]
    fig = go.Figure(go.Bar(x=order, y=[buckets[b] for b in order],
                           marker_color=["#c0392b" if b == "early" else "#2e86c1" for b in order]))
    fig.update_layout(title="Release lateness (release time minus due time)",
                      xaxis_title="lateness", yaxis_title="messages released")
    charts.append(_figure(fig, first=True))

    over_time = (tables["outcomes"].groupBy("hour", "event").agg(F.sum("messages").alias("n"))
                 .orderBy("hour").collect())
    by_event: dict[str, tuple[list[Any], list[int]]] = {}
    for r in over_time:
        xs, ys = by_event.setdefault(r["event"], ([], []))
        xs.append(r["hour"])
        ys.append(r["n"])
    fig = go.Figure([go.Bar(name=e, x=by_event[e][0], y=by_event[e][1])
                     for e in sorted(by_event, key=_event_rank)])
    fig.update_layout(barmode="stack", title="Outcomes over time (per hour, UTC)",
                      xaxis_title="hour", yaxis_title="messages")
    charts.append(_figure(fig, first=False))

    top = (tables["dead_letters"].groupBy("destination", "reason")
           .agg(F.sum("messages").alias("n")).orderBy(F.desc("n")).limit(TOP_REASONS).collect())
    if top:
        reasons = sorted({r["reason"] for r in top})
        destinations = list(dict.fromkeys(r["destination"] for r in reversed(top)))
        fig = go.Figure([
            go.Bar(name=reason, orientation="h", y=destinations,
                   x=[sum(r["n"] for r in top if r["reason"] == reason and r["destination"] == d)
                      for d in destinations])
            for reason in reasons
        ])
        fig.update_layout(barmode="stack", title="Top dead-letter reasons by destination",
                          xaxis_title="messages", height=max(320, 40 * len(destinations)))
        charts.append(_figure(fig, first=False))

    lateness = tables["lateness"]
    early = lateness.agg(F.sum("early")).first()
    early_n = int(early[0] or 0) if early is not None else 0
    verdict = ("<p class=ok>No message was released early.</p>" if early_n == 0 else
               f"<p class=bad>{early_n:,} messages were released before their due time.</p>")
    parts = [
        "<!doctype html><html><head><meta charset=utf-8><title>jms-bridge report</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:right}th{background:#eee}td:first-child{text-align:left}"
        ".note{color:#666}.ok{color:#1e8449}.bad{color:#c0392b;font-weight:bold}</style>",
        "</head><body><h1>jms-bridge report</h1>",
        (f"<p>{events:,} events from {html.escape(_when(since_ms))} to "
         f"{html.escape(_when(until_ms))}.</p>" if events else
         "<p>No events in the journal"
         + (f" from {html.escape(_when(since_ms))}" if since_ms is not None else "")
         + (f" to {html.escape(_when(until_ms))}" if until_ms is not None else "") + ".</p>"),
        verdict,
        *charts,
        _table(lateness, "Release lateness per destination and hour (ms)"),
        _table(tables["redeliveries"], "Redeliveries per destination and hour"),
        _table(tables["dead_letters"], "Dead letters by reason"),
        _table(tables["outcomes"], "Messages by outcome"),
        "</body></html>",
    ]
    return "\n".join(parts)


def _event_rank(event: str) -> int:
    return EVENT_ORDER.index(event) if event in EVENT_ORDER else len(EVENT_ORDER)
