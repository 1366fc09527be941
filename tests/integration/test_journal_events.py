"""The event journal of a real bridge, on both brokers: one message through each way a message's
life can go (released, cancelled, expired while staged, refused at send, redelivered and then
dead-lettered by its policy), each event journaled once with the fields the schema promises;
then the report job run on that journal counts what the test knows happened."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from bridge.app.journal import SCHEMA_PATH
from tests.integration.bridgeproc import BridgeProcess
from tests.integration.brokers import Broker
from tests.integration.clients import connect

RUN = uuid.uuid4().hex[:8]


def _dest(broker: Broker, what: str) -> str:
    return f"/queue/jbt-je-{RUN}-{broker.name}.{what}"


@pytest.fixture
def journaled(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[BridgeProcess, Path]]:
    tmp = tmp_path_factory.mktemp("journal-events")
    config = tmp / "bridge.yaml"
    # failure 1: redelivered at once; failure 2: moved to <queue>.dead
    config.write_text(yaml.safe_dump(
        {"redelivery": {f"/queue/jbt-je-{RUN}-{broker.name}.*": "1:move(queue:$.dead)"}}))
    folder = tmp / "journal"
    proc = BridgeProcess(
        broker.name, f"{broker.stomp_host}:{broker.stomp_port}", tmp / "bridge.log",
        extra=["--journal", str(folder), "--staging-prefix", f"jbt-je-{RUN}.staging",
               "--config", str(config)],
    ).start()
    yield proc, folder
    proc.stop()


def _staged_cli(bridge: BridgeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge.app.cli", "staged", *args, "--broker", bridge.broker,
         "--upstream-stomp", f"stomp://{bridge.upstream}",
         "--staging-prefix", f"jbt-je-{RUN}.staging"],
        capture_output=True, text=True, timeout=60)


def _events(folder: Path) -> list[dict[str, Any]]:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    events = [json.loads(line) for f in sorted(folder.glob("*.jsonl"))
              for line in f.read_text().splitlines()]
    for e in events:
        validator.validate(e)
    return events


def test_every_way_a_message_goes_is_journaled_once_and_reported(
    journaled: tuple[BridgeProcess, Path], broker: Broker, spark: Any, tmp_path: Path,
) -> None:
    bridge, folder = journaled
    delay = "x-delay" if broker.name == "rabbitmq" else "AMQ_SCHEDULED_DELAY"
    d = {w: _dest(broker, w) for w in ("released", "cancelled", "expired", "refused", "dead")}
    conn, inbox = connect(bridge.stomp_port, broker.user, broker.password)
    conn.subscribe(d["released"], id="r", ack="auto")
    conn.send(d["released"], "released", headers={delay: "800", "receipt": "r1"})
    conn.send(d["cancelled"], "cancelled", headers={delay: "600000", "receipt": "r2"})
    # Timed from its send, committed after its TTL: it reaches the staging queue expired.
    tx = conn.begin()
    conn.send(d["expired"], "expired", headers={delay: "800", "expiration": "1000",
                                                "receipt": "r3"}, transaction=tx)
    expired_sent = time.monotonic()
    conn.send(d["dead"], "dead", headers={"receipt": "r4", "persistent": "true"})
    for r in ("r1", "r2", "r4"):  # (r3 comes with its transaction's COMMIT on RabbitMQ)
        assert inbox.wait_receipt(r), r
    assert [m.body for m in inbox.take(1, timeout=15)] == ["released"], bridge.log()[-2000:]
    # Past its TTL from its own send, with room for a bridge that read it late on a busy
    # machine (the sends before it may have been read hundreds of ms earlier).
    time.sleep(max(0.0, expired_sent + 1.5 - time.monotonic()))
    conn.commit(tx)
    assert inbox.wait_receipt("r3")
    conn.subscribe(d["dead"], id="f", ack="client-individual")
    for _ in range(2):  # NACKed twice: redelivered, then moved
        (m,) = inbox.take(1, timeout=15)
        assert m.body == "dead"
        conn.nack(m.headers["ack"])
    conn.unsubscribe("f")
    conn.subscribe(d["dead"] + ".dead", id="dl", ack="auto")
    assert [m.body for m in inbox.take(1, timeout=15)] == ["dead"]
    conn.disconnect()

    listed = _staged_cli(bridge, "list", "--target", d["cancelled"], "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    cancelled = _staged_cli(bridge, "cancel", row["message_id"], "--journal", str(folder))
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr

    refuser, _ = connect(bridge.stomp_port, broker.user, broker.password)
    refuser.send(d["refused"], "refused", headers={delay: "5000", "expiration": "1000"})
    time.sleep(2.0)  # the expired one falls due; the refusal's ERROR closes its connection

    assert bridge.stop() == 0, bridge.log()  # its journal files closed, under their names
    want = {d["released"]: ["released", "staged"], d["cancelled"]: ["cancelled", "staged"],
            d["expired"]: ["expired", "staged"], d["refused"]: ["refused"],
            d["dead"]: ["dead-lettered", "redelivered"]}
    events = _events(folder)
    got = {dest: sorted(e["event"] for e in events if e.get("destination") == dest)
           for dest in want}
    assert got == want, bridge.log()[-3000:]
    by = {(e["destination"], e["event"]): e for e in events if e.get("destination") in want}
    for (_, event), e in by.items():
        assert e["broker"] == broker.name and e["v"] == 1, e
        # a refused send never had an id unless its producer gave one (the bridge gives one
        # to what it stages)
        assert e.get("message_id") or event == "refused", e
    assert by[(d["cancelled"], "cancelled")]["process"] in ("tool", "engine")
    assert by[(d["released"], "released")]["late_ms"] >= 0
    assert by[(d["expired"], "expired")]["reason"] == "MQFB_EXPIRATION"
    assert by[(d["refused"], "refused")]["reason_code"] == 2013
    assert by[(d["dead"], "redelivered")]["delivery_count"] == 1
    dead = by[(d["dead"], "dead-lettered")]
    assert (dead["reason"], dead["reason_code"], dead["delivery_count"]) == (
        "MQRC_BACKOUT_THRESHOLD_REACHED", 2362, 2)

    from bridge.pipeline import report

    result = report.run(spark, str(folder), str(tmp_path / "report"), html=False)
    outcomes = {(r["destination"], r["event"]): r["messages"]
                for r in result.tables["outcomes"].collect() if r["destination"] in want}
    assert outcomes == {key: 1 for key in by}
    (late,) = [r for r in result.tables["lateness"].collect()
               if r["destination"] == d["released"]]
    assert late["released"] == 1 and late["early"] == 0
