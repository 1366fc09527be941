"""Rescheduling staged messages, and every operator's cancel, release-now and reschedule
journaled exactly once whoever made it (the CLI, the admin API, a running engine), against each
real broker."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from bridge.app.journal import SCHEMA_PATH
from tests.integration.brokers import Broker
from tests.integration.clients import connect
from tests.integration.test_staged_selectors import Staged, cli, listed, staged_bridge

HOUR_MS = 3_600_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture(params=[False, True], ids=["queues", "catalogue"])
def setup(request: pytest.FixtureRequest, broker: Broker, tmp_path: Path) -> Any:
    with staged_bridge(broker, tmp_path, catalogue=request.param) as s:
        yield s


def send(s: Staged, dest: str, body: str, delay_ms: int, **headers: str) -> str:
    """Stage one message; its original id (given by the sender, as a bridge in front of this
    one gives it: the tools' listing by selector has tests of its own)."""
    tag = uuid.uuid4().hex
    message_id = f"staged-{tag}"
    conn, inbox = connect(s.bridge.stomp_port, s.broker.user, s.broker.password)
    conn.send(dest, body, headers={"x-delay": str(delay_ms), "receipt": tag, "tag": tag,
                                   "persistent": "true", "jms-bridge-message-id": message_id,
                                   **headers})
    assert inbox.wait_receipt(tag)
    conn.disconnect()
    return message_id


def due_of(s: Staged, message_id: str) -> int | None:
    rows = listed(s, "--message-id", message_id)
    return int(str(rows[0]["due_ms"])) if rows else None


def test_reschedule_earlier_later_and_refused_past_its_expiry(setup: Staged) -> None:
    s = setup
    dest = s.broker.queue_destination(f"jbt-staged-{uuid.uuid4().hex[:12]}")
    conn, inbox = connect(s.bridge.stomp_port, s.broker.user, s.broker.password)
    conn.subscribe(dest, id="r", ack="auto")
    far = send(s, dest, "far", 2 * HOUR_MS)
    ttl = {"expiration": str(3 * HOUR_MS)} if s.broker.name == "rabbitmq" else {
        "expires": str(now_ms() + 3 * HOUR_MS)}
    mortal = send(s, dest, "mortal", 2 * HOUR_MS, **ttl)
    # Due within a minute: the running engine takes it ahead and holds it.
    soon = send(s, dest, "soon", 30_000)

    # Later, on a message the engine holds: the order goes to the engine.
    later = cli(s, "reschedule", soon, "--in", "1h")
    assert later.returncode == 0, later.stdout + later.stderr
    assert later.stdout.startswith(f"rescheduled {soon}: due "), later.stdout
    # (On a loaded machine the engine may not have taken it yet: the tool moves it itself and
    # returns once an engine has recorded its note, so the catalogue knows the new due time.)
    due = due_of(s, soon)
    assert due is not None and due > now_ms() + HOUR_MS - 60_000, due  # (mypy: narrowed)
    assert inbox.take(1, timeout=8) == [], "released at its old due time"

    refused = cli(s, "reschedule", mortal, "--in", "4h")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.startswith("jms-bridge: MQRC_EXPIRY_ERROR (2013)"), refused.stderr
    assert due_of(s, mortal) is not None and due_of(s, mortal) < now_ms() + 2 * HOUR_MS + 5_000
    bad = cli(s, "reschedule", far, "--in", "soon")
    assert bad.returncode == 1 and "expected a duration" in bad.stderr, bad.stderr

    # Later, from the staging queues (the tool moves it itself and tells an engine, which
    # answers once its catalogue has it): listed so at once.
    moved = cli(s, "reschedule", far, "--in", "3h")
    assert moved.returncode == 0, moved.stdout + moved.stderr
    due = due_of(s, far)
    assert due is not None and due > now_ms() + 3 * HOUR_MS - 60_000, due

    # Earlier, from the staging queues, to an absolute time: not before it.
    at = now_ms() + 3_000
    earlier = cli(s, "reschedule", far, "--at", str(at))
    assert earlier.returncode == 0, earlier.stdout + earlier.stderr
    got = inbox.take(1, timeout=20)
    arrived = now_ms()
    assert [m.body for m in got] == ["far"], got
    assert arrived >= at
    assert got[0].headers.get("jms-bridge-delivery-time") == str(at)

    # By selector, to an ISO time, through the admin API; then the engine-held one back.
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2))
    q = urllib.parse.urlencode({"selector": f"tag IS NOT NULL AND JMSDestination = "
                                            f"'Queue[{dest.rsplit('/', 1)[1]}]'", "at": iso})
    status, body = s.bridge.http(f"/staged/reschedule?{q}", "POST", timeout=60)
    # "mortal" moves (its expiry is later), "soon" too.
    assert status == 200, body
    reply = json.loads(body)
    assert reply["selected"] == 2 and sorted(reply["rescheduled"]) == sorted([mortal, soon])
    got = inbox.take(2, timeout=25)
    conn.disconnect()
    assert sorted(m.body for m in got) == ["mortal", "soon"]
    assert listed(s) == []


def events(folder: Path) -> list[dict[str, Any]]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    found = [json.loads(line) for f in sorted(folder.glob("*.jsonl"))
             for line in f.read_text().splitlines()]
    for e in found:
        validator.validate(e)
    return found


@pytest.mark.parametrize("engine", ["on", "off"])
def test_each_operator_action_is_journaled_once(broker: Broker, tmp_path: Path,
                                                engine: str) -> None:
    folder = tmp_path / "journal"
    tool_folder = tmp_path / "tool-journal"
    with staged_bridge(broker, tmp_path, catalogue=False,
                       extra=("--journal", str(folder), "--staging-engine", engine)) as s:
        dest = broker.queue_destination(f"jbt-staged-{uuid.uuid4().hex[:12]}")
        ids = {what: send(s, dest, what, (3 + i) * HOUR_MS)
               for i, what in enumerate(["cli-cancel", "cli-release", "cli-reschedule",
                                         "api-cancel", "api-release", "api-reschedule",
                                         "cli-journal"])}
        expect = {ids["cli-cancel"]: "cancelled", ids["cli-release"]: "released-now",
                  ids["cli-reschedule"]: "rescheduled", ids["api-cancel"]: "cancelled",
                  ids["api-release"]: "released-now", ids["api-reschedule"]: "rescheduled"}
        for what, args in (("cli-cancel", ["cancel"]), ("cli-release", ["release"]),
                           ("cli-reschedule", ["reschedule", "--in", "5h"])):
            done = cli(s, *args[:1], ids[what], *args[1:])
            assert done.returncode == 0, done.stdout + done.stderr
            if engine == "off":
                assert "no staging engine is running" in done.stderr, done.stderr
            else:
                assert "journal:" not in done.stderr, done.stderr
        for what, path in (("api-cancel", "cancel"), ("api-release", "release"),
                           ("api-reschedule", "reschedule?in=5h")):
            status, body = s.bridge.http(f"/staged/{ids[what]}/{path}", "POST", timeout=60)
            assert status == 200, body
        # A tool with --journal journals itself only when no engine runs.
        done = cli(s, "cancel", ids["cli-journal"], extra=("--journal", str(tool_folder)))
        assert done.returncode == 0, done.stdout + done.stderr
        if engine == "off":
            assert "journaled by this tool" in done.stderr, done.stderr
            expect_tool = {ids["cli-journal"]: "cancelled"}
        else:
            expect[ids["cli-journal"]] = "cancelled"
            expect_tool = {}
        if engine == "on":  # the engine takes the notes: wait for the last one
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and s.bridge.metric(
                    "jms_bridge_staging_cancelled_total") < 3:
                time.sleep(0.2)
        assert s.bridge.stop() == 0, s.bridge.log()
    operator = {"cancelled", "released-now", "rescheduled"}
    got = [e for e in events(folder) if e["event"] in operator]
    if engine == "off":
        # Without an engine: the CLI's three are nobody's; the admin API's are the bridge's.
        for what in ("cli-cancel", "cli-release", "cli-reschedule"):
            expect.pop(ids[what])
    assert sorted((e["message_id"], e["event"]) for e in got) == sorted(expect.items()), got
    processes = {e["message_id"]: e["process"] for e in got}
    for what in ("api-cancel", "api-release", "api-reschedule"):
        assert processes[ids[what]] == ("engine" if engine == "on" else "bridge")
    rescheduled = [e for e in got if e["event"] == "rescheduled"]
    assert all(e["due"] > now_ms() + 4 * HOUR_MS and e["detail"].startswith("was due at")
               for e in rescheduled), rescheduled
    tool_events = [(e["message_id"], e["event"]) for e in events(tool_folder)
                   if e["event"] in operator] if tool_folder.exists() else []
    assert sorted(tool_events) == sorted(expect_tool.items())
