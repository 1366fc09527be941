"""What the configured redelivery policies do for a destination: for ``jms-bridge policy show``
and the admin API's ``GET /policy``, so an operator can check a configuration before relying on
it."""

from __future__ import annotations

import json
from typing import Any

from policies.redelivery import PolicyTable, describe


def policy_report(
    table: PolicyTable, destination: str, *, user: str | None = None, upto: int | None = None,
) -> dict[str, Any]:
    pattern, policy = table.lookup(destination, user)
    return {
        "destination": destination,
        "user": user,
        "pattern": pattern,
        "dialect": policy.dialect,
        "policy": policy.text,
        "failures": [
            {"first": row.first, "last": row.last, "action": row.action}
            for row in describe(policy, destination, upto)
        ],
    }


def render_policy(report: dict[str, Any], *, as_json: bool = False) -> str:
    if as_json:
        return json.dumps(report, indent=2)
    who = f" (user {report['user']})" if report["user"] else ""
    matched = (f"pattern {report['pattern']}" if report["pattern"] is not None
               else "no pattern matches: JMSJCA's default")
    lines = [
        f"{report['destination']}{who}: {matched}",
        f"policy ({report['dialect']}): {report['policy']}",
    ]
    for row in report["failures"]:
        first, last = row["first"], row["last"]
        span = (f"failure {first} and later" if last is None
                else f"failure {first}" if last == first else f"failures {first}-{last}")
        lines.append(f"  {span}: {row['action']}")
    return "\n".join(lines)
