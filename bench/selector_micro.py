"""Messages per second through a compiled selector's matches(), on one core.

Each message is a header map of 20 STOMP headers as ActiveMQ delivers them (JMS fields and
custom properties, all strings). Messages vary so that each selector selects some and rejects
others; each figure is the best of repeated runs over the given seconds (the machine is shared).

    PYTHONPATH=. .venv/bin/python bench/selector_micro.py [seconds-per-selector]

Current figures: docs/benchmarks.md, "Dead-letter replay and selectors".
"""

from __future__ import annotations

import sys
import time

from policies.selector import ACTIVEMQ, compile_selector

SELECTORS = [
    "color = 'red'",
    "JMSPriority > 4",
    "color = 'red' AND size > 5",
    "JMSType = 'order' AND JMSPriority BETWEEN 3 AND 7 AND region IN ('EU', 'US', 'APAC')",
    "name LIKE 'cust%' OR (JMSCorrelationID IS NOT NULL AND amount > 100)",
    "NOT (missing = 'x') OR JMSDestination LIKE 'Queue[orders%'",
    "(color = 'red' OR color = 'blue') AND NOT (size < 3) AND JMSDeliveryMode = 'PERSISTENT'"
    " AND JMSTimestamp > 1700000000000 AND name NOT LIKE '%test%'",
]


def messages(count: int = 1000) -> list[dict[str, str]]:
    colors = ["red", "green", "blue", "yellow"]
    out = []
    for i in range(count):
        headers = {
            "destination": "/queue/orders.incoming",
            "message-id": f"ID:host-1234-1700000000000-1:1:1:1:{i}",
            "timestamp": str(1_700_000_000_000 + i),
            "expires": "0",
            "priority": str(i % 10),
            "persistent": "true" if i % 3 == 0 else "false",
            "subscription": "sub-0",
            "correlation-id": f"c-{i}",
            "type": "order" if i % 3 else "invoice",
            "content-length": "1024",
            "color": colors[i % 4],
            "size": str(i % 11),
            "region": ["EU", "US", "APAC", "LATAM"][i % 4],
            "name": f"customer-{i}" if i % 5 else f"test-{i}",
            "amount": str((i * 37) % 200),
            "channel": "web",
            "tenant": f"t{i % 7}",
            "trace-id": f"{i:032x}",
            "retry": "0",
            "source": "erp",
        }
        assert len(headers) == 20
        out.append(headers)
    return out


def rate(selector: str, batch: list[dict[str, str]], seconds: float) -> tuple[float, int]:
    matches = compile_selector(selector, ACTIVEMQ).matches
    best, selected = 0.0, sum(map(matches, batch))
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        for _ in range(20):
            for headers in batch:
                matches(headers)
        best = max(best, 20 * len(batch) / (time.perf_counter() - started))
    return best, selected


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    batch = messages()
    print(f"{'messages/s':>12}  {'selected':>8}  selector (20-header messages, best of {seconds}s)")
    for selector in SELECTORS:
        per_second, selected = rate(selector, batch, seconds)
        print(f"{per_second:12,.0f}  {selected:>5}/{len(batch)}  {selector}")


if __name__ == "__main__":
    main()
