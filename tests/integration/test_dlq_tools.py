"""``jms-bridge dlq``: browse, count, purge, replay, move, export and the rules handler, on both
real brokers: the bridge's own dead letters, and each broker's native ones (RabbitMQ's
dead-letter exchange after a reject, ActiveMQ's ActiveMQ.DLQ after an expiry and a NACK)."""

from __future__ import annotations

import base64
import json
import os
import queue as queues
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from adapters.base import Message
from adapters.queues import DROP, QueueTools
from adapters.queues_rabbitmq import RabbitMQQueues
from bridge.app.config import Settings, bridge_amqp, resolve
from bridge.app.dlq import queue_tools
from bridge.deadletter import metadata, ops
from bridge.staging import envelope
from policies.errors import BridgeError
from policies.selector import ACTIVEMQ, RABBITMQ
from tests.integration.brokers import BROKERS, Broker, require

ROOT = Path(__file__).resolve().parents[2]
JMS_BRIDGE = [sys.executable, "-m", "bridge.app.cli"]  # this checkout's code
MGMT = "http://guest:guest@127.0.0.1:15672"
# Not jbt-: other sessions' suites delete every jbt- queue when they end, which would pull
# these queues away mid-test; this module deletes its own (RabbitMQ; ActiveMQ drops idle ones).
PREFIX = f"jbtd-{uuid.uuid4().hex[:6]}-"


def new_run() -> str:
    return uuid.uuid4().hex[:8]


# ActiveMQ queues the tests filled: emptied at the end (a broker left holding tens of thousands
# of messages runs short of heap for everyone else).
_ACTIVEMQ_FILLED: set[str] = set()


def _empty_activemq_queues() -> None:
    if not _ACTIVEMQ_FILLED:
        return
    try:
        tools = queue_tools(settings_for(BROKERS["activemq"]))
        tools.connect()
    except BridgeError:
        return
    try:
        for name in sorted(_ACTIVEMQ_FILLED):
            tools.sweep(name, lambda _f: DROP)
    except BridgeError:
        pass
    finally:
        tools.close()


@pytest.fixture(scope="module", autouse=True)
def _delete_own_queues() -> Iterator[None]:
    yield
    _empty_activemq_queues()
    from tests.integration.staging_util import management

    broker = BROKERS["rabbitmq"]
    try:
        names = [q["name"] for q in management(broker, "/queues/%2F?columns=name")
                 if q["name"].startswith(PREFIX)]
        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
    except (OSError, pika.exceptions.AMQPError):
        return
    channel = conn.channel()
    for name in names:
        channel.queue_delete(name)
    conn.close()


def flags(broker: Broker) -> list[str]:
    if broker.name == "rabbitmq":
        return ["--broker", "rabbitmq", "--upstream-stomp",
                f"stomp://guest:guest@{broker.stomp_host}:{broker.stomp_port}",
                "--upstream-management", MGMT]
    return ["--broker", "activemq", "--upstream-stomp",
            f"stomp://{broker.user}:{broker.password}@{broker.stomp_host}:{broker.stomp_port}"]


def cli(broker: Broker, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    return subprocess.run([*JMS_BRIDGE, "dlq", args[0], *flags(broker), *args[1:]],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def settings_for(broker: Broker) -> Settings:
    argv = dict(zip(flags(broker)[::2], flags(broker)[1::2], strict=True))
    return resolve({k.lstrip("-"): v for k, v in argv.items()})


def _tools(broker: Broker) -> Iterator[QueueTools]:
    require(broker)
    settings = settings_for(broker)
    t = queue_tools(settings)
    if isinstance(t, RabbitMQQueues):
        # The test's own connection idles while the CLI runs, a minute and more on a loaded
        # machine: RabbitMQ closed it for the heart-beats it missed.
        t = RabbitMQQueues(bridge_amqp(settings), management=settings.upstream_management,
                           heartbeat=0)
    t.connect()
    yield t
    t.close()


@pytest.fixture
def tools(broker: Broker) -> Iterator[QueueTools]:
    yield from _tools(broker)


@pytest.fixture
def rabbitmq() -> Iterator[QueueTools]:
    yield from _tools(BROKERS["rabbitmq"])


@pytest.fixture
def activemq() -> Iterator[QueueTools]:
    yield from _tools(BROKERS["activemq"])


def dead_letter(run: str, n: int, target: str, region: str, **extra: str) -> Message:
    """A dead-letter copy as the bridge's redelivery policy writes it."""
    headers = {
        "persistent": "true", "region": region, "run": run, "n": str(n),
        "correlation-id": f"corr-{n}",
        envelope.MESSAGE_ID: f"{run}-{n}",
        envelope.DELIVERY_COUNT: "5",
        envelope.REASON: "MQRC_BACKOUT_THRESHOLD_REACHED", envelope.REASON_CODE: "2362",
        envelope.REASON_TEXT: "delivered 5 times", envelope.FAILED_AT: "1795596000000",
        envelope.ORIGINAL_DESTINATION: target,
        envelope.ORIGINAL_JMS_DESTINATION: f"Queue[{target.rsplit('/', 1)[1]}]",
        envelope.POLICY: "jmsjca: 5:move(queue:dlq)",
        **extra,
    }
    return Message(headers, f"body {n}".encode())


def fill(tools: QueueTools, dlq: str, messages: list[Message]) -> None:
    if tools.name == "activemq":
        _ACTIVEMQ_FILLED.add(dlq)
    for m in messages:
        tools.publish(f"/queue/{dlq}", m)  # type: ignore[attr-defined]


def ids(tools: QueueTools, queue: str) -> list[str]:
    return [f.message.headers.get(envelope.MESSAGE_ID, f.broker_id) for f in tools.inspect(queue)]


def drain(tools: QueueTools, queue: str) -> list[Message]:
    got: list[Message] = []
    tools.sweep(queue, lambda f: got.append(f.message) or DROP)
    return got


def test_browse_count_replay_purge_with_tibco_selector(broker: Broker,
                                                        tools: QueueTools) -> None:
    run = new_run()
    dlq, a, b = f"{PREFIX}{run}-dlq", f"/queue/{PREFIX}{run}-a", f"/queue/{PREFIX}{run}-b"
    order = [(a, "EU"), (b, "US"), (a, "US"), (b, "EU"), (a, "EU"), (b, "US")]
    fill(tools, dlq, [dead_letter(run, i, t, r) for i, (t, r) in enumerate(order)])
    on_a = f"JMSDestination = 'Queue[{PREFIX}{run}-a]'"

    listed = cli(broker, "list", "--queue", dlq, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["incomplete"] is None
    assert {"queue": dlq, "messages": 6} in json.loads(listed.stdout)["queues"]
    counted = cli(broker, "count", "--queue", dlq, "--selector", on_a)
    assert (counted.returncode, counted.stdout.strip()) == (0, "3"), counted.stderr
    shown = cli(broker, "browse", "--queue", dlq, "--selector", on_a, "--json", "--body")
    entries = json.loads(shown.stdout)
    assert [e["original_id"] for e in entries] == [f"{run}-0", f"{run}-2", f"{run}-4"]
    first = entries[0]
    assert first["reason"] == "MQRC_BACKOUT_THRESHOLD_REACHED" and first["reason_code"] == 2362
    assert first["original_destination"] == a and first["delivery_count"] == 5
    assert first["failed_at"].startswith("2026-11-") and first["body"] == "body 0"
    text = cli(broker, "browse", "--queue", dlq, "--limit", "1")
    assert text.returncode == 0 and f"{run}-0" in text.stdout and f"{run}-1" not in text.stdout

    replayed = cli(broker, "replay", "--queue", dlq, "--selector", on_a, "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["done"] == 3
    back = drain(tools, a.removeprefix("/queue/"))
    assert [m.headers[metadata.REPLAY_OF] for m in back] == [f"{run}-0", f"{run}-2", f"{run}-4"]
    for m in back:
        assert not any(h in m.headers for h in metadata.BRIDGE_HEADERS)
        assert m.headers["region"] and m.headers["correlation-id"].startswith("corr-")
    assert back[0].body == b"body 0"
    assert ids(tools, dlq) == [f"{run}-1", f"{run}-3", f"{run}-5"]  # the rest, in order

    refused = cli(broker, "purge", "--queue", dlq)
    assert refused.returncode == 1 and "--all" in refused.stderr
    purged = cli(broker, "purge", "--queue", dlq, "--selector", "region = 'US'")
    assert purged.returncode == 0 and "purged 2 of 3" in purged.stdout, purged.stdout
    assert ids(tools, dlq) == [f"{run}-3"]
    moved = cli(broker, "move", "--queue", dlq, "--to", f"{PREFIX}{run}-parked")
    assert moved.returncode == 0, moved.stderr
    parked = drain(tools, f"{PREFIX}{run}-parked")
    assert len(parked) == 1 and parked[0].headers[envelope.REASON] == (
        "MQRC_BACKOUT_THRESHOLD_REACHED")  # move keeps the metadata
    missing = cli(broker, "browse", "--queue", f"{PREFIX}{run}-none")
    if broker.name == "rabbitmq":  # ActiveMQ makes a queue when it is named
        assert missing.returncode == 3 and "no queue" in missing.stderr
        # A name longer than AMQP's 255 bytes cannot be a queue: no such queue, not a broker
        # error (pika cannot even ask).
        too_long = cli(broker, "count", "--queue", "q" * 300)
        assert too_long.returncode == 3 and "no queue" in too_long.stderr, too_long.stderr
    bad = cli(broker, "browse", "--queue", dlq, "--selector", "JMSPriority >> 4")
    assert bad.returncode == 1 and "column" in bad.stderr and "Traceback" not in bad.stderr


def test_rabbitmq_native_dead_letters(rabbitmq: QueueTools) -> None:
    """A queue's dead-letter exchange after basic.reject: x-death read, replayed home."""
    broker, tools = BROKERS["rabbitmq"], rabbitmq
    run = new_run()
    src, dlq = f"{PREFIX}{run}-src", f"{PREFIX}{run}-dlx"
    conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
    ch = conn.channel()
    ch.queue_declare(dlq, durable=True)
    ch.queue_declare(src, durable=True, arguments={
        "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    for i in range(4):
        ch.basic_publish("", src, f"m{i}".encode(), pika.BasicProperties(
            message_id=f"{run}-{i}", delivery_mode=2,
            headers={"region": "EU" if i % 2 else "US"}))
    for _ in range(4):
        method, _, _ = ch.basic_get(src)
        ch.basic_reject(method.delivery_tag, requeue=False)
    deadline = time.monotonic() + 5
    while tools.size(dlq) != 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    picker = ops.Picker.of(f"JMSDestination = 'Queue[{src}]' AND region = 'EU'", RABBITMQ)
    entries = list(ops.browse(tools, dlq, picker, limit=None))
    assert [e.info.original_id for e in entries] == [f"{run}-1", f"{run}-3"]
    assert entries[0].info.kind == "rabbitmq" and entries[0].info.reason_text == "rejected"
    assert entries[0].info.original_destination == f"/amq/queue/{src}"
    assert entries[0].info.delivery_count == 1 and entries[0].info.failed_at_ms
    outcome = ops.change(tools, "replay", dlq, picker, tools.format)  # type: ignore[attr-defined]
    assert outcome.done == 2 and outcome.error is None
    got = []
    for _ in range(2):
        method, props, body = ch.basic_get(src, auto_ack=True)
        got.append((props.message_id, body, props.headers))
    assert [g[0] for g in got] == [f"{run}-1", f"{run}-3"]
    for _, _, headers in got:
        assert metadata.REPLAY_OF in headers and headers["region"] == "EU"
        assert not any(h.startswith("x-first-death") or h.startswith("x-death") for h in headers)
    assert [f.broker_id for f in tools.inspect(dlq)] == [f"{run}-0", f"{run}-2"]
    conn.close()


def test_activemq_native_dead_letters(activemq: QueueTools) -> None:
    """ActiveMQ.DLQ after an expiry and a NACK, shared with everyone: picked by selector."""
    from adapters.queues_activemq import ActiveMQQueues

    tools = activemq
    assert isinstance(tools, ActiveMQQueues)
    run = new_run()
    src = f"{PREFIX}{run}-src"
    now = int(time.time() * 1000)
    tools.publish(f"/queue/{src}", Message(
        {"persistent": "true", "run": run, "n": "0", "expires": str(now + 50)}, b"expired"))
    tools.publish(f"/queue/{src}", Message({"persistent": "true", "run": run, "n": "1"},
                                           b"nacked"))
    time.sleep(0.2)
    inbox: queues.Queue = queues.Queue()
    sid = tools._subscribe(src, inbox, ack="client-individual")
    frame = inbox.get(timeout=5)  # the expired one went to the DLQ on dispatch
    tools._live().nack(frame.headers["ack"])
    tools._unsubscribe(sid)
    mine = ops.Picker.of(f"run = '{run}'", ACTIVEMQ)
    deadline = time.monotonic() + 10
    while ops.count(tools, "ActiveMQ.DLQ", mine) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    entries = sorted(ops.browse(tools, "ActiveMQ.DLQ", mine, limit=None),
                     key=lambda e: e.headers["n"])
    assert [e.info.kind for e in entries] == ["activemq", "activemq"]
    assert entries[0].info.reason == "MQFB_EXPIRATION"
    assert entries[1].info.reason == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert {e.info.original_destination for e in entries} == {f"/queue/{src}"}
    picker = ops.Picker.of(f"run = '{run}' AND JMSDestination = 'Queue[{src}]'", ACTIVEMQ)
    outcome = ops.change(tools, "replay", "ActiveMQ.DLQ", picker, tools.format)
    assert outcome.done == 2 and outcome.error is None
    back = sorted(drain(tools, src), key=lambda m: m.headers["n"])
    assert [m.body for m in back] == [b"expired", b"nacked"]
    for m in back:
        assert "original-destination" not in m.headers and metadata.REPLAY_OF in m.headers
        assert "dlqDeliveryFailureCause" not in m.headers
    assert ops.count(tools, "ActiveMQ.DLQ", mine) == 0


RULES = """\
* the handler's rules: every action
INPUTQ({dlq}) WAIT(NO) RETRYINT(0)
DESTQ({prefix}{run}-orders.*) ACTION(RETRY) RETRY(1)
DESTQ({prefix}{run}-orders.*) ACTION(FWD) +
    FWDQ({prefix}{run}-parked.$)
SELECTOR('region = ''DROP''') ACTION(DISCARD)
ACTION(IGNORE)
"""


def test_rules_handler_every_action(broker: Broker, tools: QueueTools, tmp_path: Path) -> None:
    run = new_run()
    dlq, orders = f"{PREFIX}{run}-dlq", f"/queue/{PREFIX}{run}-orders.eu"
    fill(tools, dlq, [
        dead_letter(run, 0, orders, "EU"),  # RETRY
        dead_letter(run, 1, orders, "EU", **{metadata.RETRIES: "1"}),  # retried: FWD
        dead_letter(run, 2, f"/queue/{PREFIX}{run}-other", "DROP"),  # DISCARD
        dead_letter(run, 3, f"/queue/{PREFIX}{run}-other", "EU"),  # IGNORE
    ])
    rules = tmp_path / "rules.txt"
    rules.write_text(RULES.format(dlq=dlq, run=run, prefix=PREFIX))
    done = cli(broker, "handle", "--rules", str(rules), "--once")
    assert done.returncode == 0, done.stderr
    assert "DISCARD 1" in done.stdout and "FWD 1" in done.stdout and "RETRY 1" in done.stdout
    retried = drain(tools, orders.removeprefix("/queue/"))
    assert [m.headers[metadata.RETRIES] for m in retried] == ["1"]
    assert envelope.REASON not in retried[0].headers
    parked = drain(tools, f"{PREFIX}{run}-parked.{PREFIX}{run}-orders.eu")
    assert [m.headers[envelope.MESSAGE_ID] for m in parked] == [f"{run}-1"]
    assert parked[0].headers[envelope.REASON] == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert ids(tools, dlq) == [f"{run}-3"]
    # The log names each decision once, with the original id.
    assert done.stderr.count(f"{run}-3") <= 1 or done.stdout.count(f"{run}-3") <= 1

    bad = tmp_path / "bad.txt"
    bad.write_text("ACTION(DISCARD)\n\n* a comment\nDESTQ(x) ACTION(FWD)\n")
    failed = cli(broker, "handle", "--rules", str(bad), "--once")
    assert failed.returncode == 1 and "line 4" in failed.stderr and "FWDQ" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1


def test_export_with_remove(broker: Broker, tools: QueueTools, tmp_path: Path) -> None:
    run = new_run()
    dlq = f"{PREFIX}{run}-dlq"
    fill(tools, dlq, [dead_letter(run, i, f"/queue/{PREFIX}{run}-a", "EU" if i % 3 else "US")
                      for i in range(9)])
    out = tmp_path / "archive"
    done = cli(broker, "export", "--queue", dlq, "--selector", "region = 'EU'", "--to",
               str(out), "--remove")
    assert done.returncode == 0, done.stderr
    files = sorted(out.iterdir())
    assert files and all(f.suffix == ".jsonl" for f in files)  # no temporary file left
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert sorted(r["original_id"] for r in rows) == sorted(
        f"{run}-{i}" for i in range(9) if i % 3)
    r = rows[0]
    assert r["schema"] == 1 and r["queue"] == dlq and r["broker"] == broker.name
    assert r["headers"]["run"] == run and r["reason"] == "MQRC_BACKOUT_THRESHOLD_REACHED"
    assert base64.b64decode(r["body_base64"]).startswith(b"body ")
    assert ids(tools, dlq) == [f"{run}-0", f"{run}-3", f"{run}-6"]
    if broker.name == "rabbitmq":
        import pyarrow.parquet as pq

        kept = cli(broker, "export", "--queue", dlq, "--to", str(tmp_path / "pq"), "--format",
                   "parquet")
        assert kept.returncode == 0, kept.stderr
        table = pq.read_table(next((tmp_path / "pq").iterdir()))
        assert table.num_rows == 3 and dict(table.column("headers")[0].as_py())["run"] == run
        assert table.column("body")[0].as_py().startswith(b"body ")
        assert tools.size(dlq) == 3  # without --remove nothing leaves


def test_replay_killed_and_rerun_replays_each_once(broker: Broker, tools: QueueTools) -> None:
    run = new_run()
    dlq, target = f"{PREFIX}{run}-dlq", f"{PREFIX}{run}-target"
    n = 20_000 if broker.name == "rabbitmq" else 3_000
    headers = dead_letter(run, 0, f"/queue/{target}", "EU").headers
    conn_publish = _bulk(broker, tools, dlq, headers, n)
    assert conn_publish == n
    args = [*JMS_BRIDGE, "dlq", "replay", *flags(broker), "--queue", dlq, "--selector",
            "n_mod = 'even'"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (tools.size(target) or 0) < 200:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    at_kill = tools.size(target) or 0
    assert 0 < at_kill < n // 2, f"the kill came too late ({at_kill} replayed)"
    again = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    got = [m.headers[metadata.REPLAY_OF] for m in drain(tools, target)]
    want = [f"{run}-{i}" for i in range(0, n, 2)]
    assert len(got) == len(set(got)) == n // 2 and sorted(got) == sorted(want)
    left = ids(tools, dlq)
    others = [f"{run}-{i}" for i in range(1, n, 2)]
    # Each there once, in their order, but for where the killed round stopped sending them
    # round to the tail (RabbitMQ holds the first 1,000 in place and sends the rest round).
    assert sorted(left) == sorted(others)
    cut = next((i for i in range(1, len(left)) if others.index(left[i]) < others.index(
        left[i - 1])), len(left))
    assert left[:cut] == sorted(left[:cut], key=others.index)
    assert left[cut:] == sorted(left[cut:], key=others.index)


def _bulk(broker: Broker, tools: QueueTools, dlq: str, headers: dict[str, str], n: int) -> int:
    """n dead letters, odd and even alternating."""
    if broker.name == "activemq":
        _ACTIVEMQ_FILLED.add(dlq)
    base = {k: v for k, v in headers.items() if k not in ("n", envelope.MESSAGE_ID)}
    run = headers["run"]
    if broker.name == "rabbitmq":
        from adapters.rabbitmq_stomp import amqp_properties

        conn = pika.BlockingConnection(pika.URLParameters(broker.amqp_url or ""))
        ch = conn.channel()
        ch.queue_declare(dlq, durable=True)
        # Unconfirmed (a confirm each costs seconds here); the queue's count says they are in.
        for i in range(n):
            h = {**base, "n": str(i), "n_mod": "odd" if i % 2 else "even",
                 envelope.MESSAGE_ID: f"{run}-{i}"}
            ch.basic_publish("", dlq, f"body {i}".encode(), amqp_properties(h))
        deadline = time.monotonic() + 60
        while (count := ch.queue_declare(dlq, passive=True).method.message_count) < n:
            assert time.monotonic() < deadline, f"{count} of {n} dead letters on {dlq}"
            time.sleep(0.05)
        conn.close()
        return count
    conn = tools._live()  # type: ignore[attr-defined]
    for i in range(n):
        h = {**base, "n": str(i), "n_mod": "odd" if i % 2 else "even",
             envelope.MESSAGE_ID: f"{run}-{i}"}
        message = Message(h, f"body {i}".encode())
        if i == n - 1:  # its receipt says the broker has them all
            tools.publish(f"/queue/{dlq}", message)  # type: ignore[attr-defined]
        else:
            tools._send(conn, f"/queue/{dlq}", message, text=False)  # type: ignore
    return n


TOKEN = "dlq-test-token"


def test_admin_api(broker: Broker, tools: QueueTools, tmp_path: Path) -> None:
    """The same operations over HTTP, token-protected like /staged, counted on /metrics."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from bridge.app.admin import Admin
    from bridge.app.auth import TokenFile
    from bridge.app.metrics import Metrics
    from policies.endpoints import Endpoint

    run = new_run()
    dlq, a = f"{PREFIX}{run}-dlq", f"/queue/{PREFIX}{run}-a"
    fill(tools, dlq, [dead_letter(run, i, a, "EU" if i % 2 else "US") for i in range(4)])
    settings = settings_for(broker)
    (tmp_path / "token").write_text(TOKEN + "\n")
    bearer = {"Authorization": f"Bearer {TOKEN}"}

    def make(tokens: TokenFile | None) -> Admin:
        return Admin(metrics=Metrics(), broker=broker.name, upstream=Endpoint("127.0.0.1", 1),
                     tokens=tokens, queue_tools=lambda: queue_tools(settings))

    async def body() -> None:
        async with TestClient(TestServer(make(None).app)) as client:
            assert (await client.get(f"/dlq/{dlq}/messages")).status == 403
        admin = make(TokenFile(str(tmp_path / "token")))
        async with TestClient(TestServer(admin.app)) as client:
            assert (await client.get("/dlq")).status == 401
            listed = await (await client.get("/dlq", headers=bearer)).json()
            assert {"queue": dlq, "messages": 4} in listed["queues"]
            assert listed["incomplete"] is None
            eu = {"selector": "region = 'EU'"}
            got = await client.get(f"/dlq/{dlq}/messages", params={**eu, "body": "true"},
                                   headers=bearer)
            entries = await got.json()
            assert [e["original_id"] for e in entries] == [f"{run}-1", f"{run}-3"]
            assert entries[0]["body"] == "body 1" and entries[0]["original_destination"] == a
            summary = await client.get(f"/dlq/{dlq}/summary", headers=bearer)
            assert await summary.json() == {
                "queue": dlq, "count": 4, "by_reason": {"MQRC_BACKOUT_THRESHOLD_REACHED": 4},
                "by_destination": {a: 4}}
            summary = await client.get(f"/dlq/{dlq}/summary", params=eu, headers=bearer)
            assert (await summary.json())["count"] == 2
            if broker.name == "rabbitmq":  # (ActiveMQ answers for any name: an empty queue)
                missing = await client.get(f"/dlq/{dlq}-none/summary", headers=bearer)
                assert missing.status == 404
            count = await client.get(f"/dlq/{dlq}/count", params=eu, headers=bearer)
            assert (await count.json())["count"] == 2
            bad = await client.get(f"/dlq/{dlq}/count", params={"selector": "a >> 1"},
                                   headers=bearer)
            assert bad.status == 400 and "column" in (await bad.json())["error"]
            assert (await client.post(f"/dlq/{dlq}/purge", headers=bearer)).status == 400
            replayed = await client.post(f"/dlq/{dlq}/replay", params=eu, headers=bearer)
            assert replayed.status == 200 and (await replayed.json())["done"] == 2
            purged = await client.post(f"/dlq/{dlq}/purge", params={"all": "true"},
                                       headers=bearer)
            assert (await purged.json())["done"] == 2
            metrics = await (await client.get("/metrics")).text()
            assert ('jms_bridge_dlq_actions_total{operation="replay",'
                    'reason="MQRC_BACKOUT_THRESHOLD_REACHED"} 2.0') in metrics

    asyncio.run(body())
    assert [m.headers[metadata.REPLAY_OF] for m in drain(tools, a.removeprefix("/queue/"))] == [
        f"{run}-1", f"{run}-3"]
    assert tools.size(dlq) == 0


def test_a_refused_put_stops_the_replay_and_loses_nothing(broker: Broker,
                                                          tools: QueueTools) -> None:
    """A target the broker refuses (RabbitMQ: a queue that does not exist; ActiveMQ: a
    temporary queue that does not exist, refused by the broker inside the transaction): one
    line with the MQRC reason, exit 1, and every message still on the dead-letter queue, in
    order."""
    run = new_run()
    dlq = f"{PREFIX}{run}-dlq"
    fill(tools, dlq, [dead_letter(run, i, f"/queue/{PREFIX}{run}-a", "EU") for i in range(5)])
    to = (f"/amq/queue/{PREFIX}{run}-none" if broker.name == "rabbitmq"
          else f"/remote-temp-queue/ID:{run}-1:1:1")
    done = cli(broker, "replay", "--queue", dlq, "--to", to, "--log-level", "error")
    reason = "MQRC_UNKNOWN_OBJECT_NAME (2085)"
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("jms-bridge:")]
    assert len(errors) == 1 and reason in errors[0], done.stderr
    assert "Traceback" not in done.stderr and "replayed 0 of" in done.stdout
    assert ids(tools, dlq) == [f"{run}-{i}" for i in range(5)]


def test_activemq_a_sends_late_error_is_still_the_puts_refusal(activemq: QueueTools) -> None:
    """ActiveMQ answers a transaction's frames asynchronously: the ERROR (naming no receipt) of
    a SEND it refused can come after the last SEND's receipt (CI saw it come late in the
    staging engine's settle), and the COMMIT is then refused. Held back 0.3 s here, it is
    still the put's refusal, with its reason, and nothing of the transaction is put."""
    import threading

    from adapters.queues import Put
    from policies.errors import PutRefused
    from policies.reasons import MQRC_UNKNOWN_OBJECT_NAME

    run = new_run()
    target = f"{PREFIX}{run}-target"
    gone = f"/remote-temp-queue/ID:{run}-late-1:1:1"
    activemq._live()  # type: ignore[attr-defined]
    listener = activemq._listener  # type: ignore[attr-defined]
    on_error = listener.on_error
    held_back: list[object] = []

    def late(frame: object) -> None:
        if "receipt-id" in frame.headers:  # type: ignore[attr-defined]
            on_error(frame)
        else:
            held_back.append(frame)
            threading.Timer(0.3, on_error, (frame,)).start()

    listener.on_error = late
    puts = [Put(f"/queue/{target}", Message({"n": str(i)}, b"x")) for i in range(3)]
    puts[1] = Put(gone, Message({"n": "1"}, b"x"))  # refused; the last SEND has the receipt
    with pytest.raises(PutRefused) as refused:
        activemq.put_all(puts)  # type: ignore[attr-defined]
    assert held_back, "the refused SEND's ERROR named a receipt: nothing was held back"
    assert refused.value.reason is MQRC_UNKNOWN_OBJECT_NAME, refused.value
    assert gone in refused.value.destination and "none of them was put" in str(refused.value)
    assert not activemq.size(target)

    # A sweep (a replay): its ACKs are in the refused transaction too. Its batch stays on
    # the dead-letter queue, at once (a batch committed before it is on the target); each
    # message is in one of the two, once.
    dlq = f"{PREFIX}{run}-dlq"
    fill(activemq, dlq, [dead_letter(run, i, f"/queue/{target}", "EU") for i in range(5)])
    held_back.clear()
    with pytest.raises(PutRefused) as refused:
        activemq.sweep(dlq, lambda f: Put(gone if f.message.headers.get("n") == "2" else
                                          f"/queue/{target}", f.message))
    assert held_back and refused.value.reason is MQRC_UNKNOWN_OBJECT_NAME, refused.value
    left, moved = ids(activemq, dlq), ids(activemq, target)
    assert f"{run}-2" in left and sorted(left + moved) == [f"{run}-{i}" for i in range(5)]


def test_the_handler_runs_until_stopped(broker: Broker, tools: QueueTools,
                                        tmp_path: Path) -> None:
    run = new_run()
    dlq = f"{PREFIX}{run}-dlq"
    fill(tools, dlq, [])
    tools.size(dlq)  # RabbitMQ: declare it
    if broker.name == "rabbitmq":
        tools.ensure_queues([dlq])  # type: ignore[attr-defined]
    rules = tmp_path / "rules.txt"
    rules.write_text(f"INPUTQ({dlq}) RETRYINT(0.2)\nSELECTOR('region = ''EU''') ACTION(DISCARD)"
                     "\nACTION(IGNORE)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    from tests.integration.bridgeproc import free_port

    port = free_port()
    proc = subprocess.Popen([*JMS_BRIDGE, "dlq", "handle", *flags(broker), "--rules",
                             str(rules), "--metrics-listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)
    try:
        time.sleep(1.0)
        fill(tools, dlq, [dead_letter(run, 0, "/queue/x", "EU"),
                          dead_letter(run, 1, "/queue/x", "US")])
        # A pass holds the queue's messages for a moment (ActiveMQ's browser does not show
        # them then), so the queue is judged by what was seen, and again once stopped.
        deadline, seen = time.monotonic() + 20, ids(tools, dlq)
        while time.monotonic() < deadline and seen != [f"{run}-1"]:
            time.sleep(0.3)
            seen = ids(tools, dlq)
        assert seen == [f"{run}-1"]  # the EU one discarded, the other left
        assert proc.poll() is None  # still running
        import urllib.request

        # The pass counts its actions once it has settled them: the queue can show the change
        # a moment before the counter does.
        counted = ('jms_bridge_dlq_actions_total{operation="handle-DISCARD",'
                   'reason="MQRC_BACKOUT_THRESHOLD_REACHED"} 1.0')
        deadline, text = time.monotonic() + 10, ""
        while counted not in text and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as page:
                text = page.read().decode()
            if counted not in text:
                time.sleep(0.1)
        assert counted in text, text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "stopped:" in out and "DISCARD 1" in out
    assert err.count(f"original_id={run}-1") == 1  # left in place: logged once, not every pass
    assert ids(tools, dlq) == [f"{run}-1"]  # and still there once the handler has stopped


def test_a_long_queue_keeps_its_order(broker: Broker, tools: QueueTools) -> None:
    """More kept messages than RabbitMQ's sweep holds (1,000) and than ActiveMQ pages (200):
    they go round the queue, and come out of the round in their old order."""
    run = new_run()
    dlq, target = f"{PREFIX}{run}-dlq", f"{PREFIX}{run}-target"
    n = 2_400
    _bulk(broker, tools, dlq, dead_letter(run, 0, f"/queue/{target}", "EU").headers, n)
    picker = ops.Picker.of("n IN ('7', '1500', '2399')", ACTIVEMQ if broker.name == "activemq"
                           else RABBITMQ)
    outcome = ops.change(tools, "purge", dlq, picker, tools.format)  # type: ignore[attr-defined]
    assert (outcome.done, outcome.error) == (3, None)
    assert ids(tools, dlq) == [f"{run}-{i}" for i in range(n) if i not in (7, 1500, 2399)]


def test_browse_into_a_closed_pipe_ends_quietly(broker: Broker, tools: QueueTools) -> None:
    """``jms-bridge dlq browse --json | head``: the reader leaves after a few lines, the command
    ends without a traceback (exit 0, or 141 as a shell reports a command stopped by SIGPIPE)."""
    run = new_run()
    dlq = f"{PREFIX}{run}-pipe"
    fill(tools, dlq, [dead_letter(run, i, f"/queue/{PREFIX}{run}-a", "EU", pad="x" * 400)
                      for i in range(250)])  # about 250 KB of JSON: more than a pipe holds
    env = {k: v for k, v in os.environ.items() if not k.startswith("JMS_BRIDGE_")}
    shell = " ".join([*JMS_BRIDGE, "dlq", "browse", *flags(broker), "--queue", dlq, "--json",
                      "--body"]) + " | head -n 3 >/dev/null; echo rc=${PIPESTATUS[0]} >&2"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120,
                          env=env, cwd=ROOT)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] in ("rc=0", "rc=141"), done.stderr
    assert tools.size(dlq) == 250  # browsing changed nothing


def _forms(broker: Broker, name: str) -> list[str]:
    """Every way the bridge itself prints a queue on ``broker``."""
    forms = [name, f"/queue/{name}"]
    if broker.name == "rabbitmq":
        forms.append(f"/amq/queue/{name}")
    return forms


def test_every_tool_takes_the_queue_in_each_form_the_bridge_prints(
    broker: Broker, tools: QueueTools, tmp_path: Path
) -> None:
    run = new_run()
    dlq = f"{PREFIX}stompwire-{run}-dlq"
    target = f"/queue/{PREFIX}stompwire-{run}-a"
    fill(tools, dlq, [dead_letter(run, i, target, "EU" if i % 2 else "US") for i in range(6)])
    for form in _forms(broker, dlq):
        counted = cli(broker, "count", "--queue", form)
        assert (counted.returncode, counted.stdout.strip()) == (0, "6"), (form, counted.stderr)
        listed = cli(broker, "list", "--queue", form, "--json")
        assert {"queue": dlq, "messages": 6} in json.loads(listed.stdout)["queues"], form
        shown = cli(broker, "browse", "--queue", form, "--json")
        assert len(json.loads(shown.stdout)) == 6, (form, shown.stderr)
        out = tmp_path / f"export-{len(form)}"
        kept = cli(broker, "export", "--queue", form, "--to", str(out))
        assert kept.returncode == 0, (form, kept.stderr)
        rows = [json.loads(line) for f in out.iterdir() for line in f.read_text().splitlines()]
        assert len(rows) == 6 and {r["queue"] for r in rows} == {dlq}, form
    forms = _forms(broker, dlq)
    replayed = cli(broker, "replay", "--queue", forms[1], "--selector", "region = 'US'")
    assert replayed.returncode == 0 and "3" in replayed.stdout, replayed.stderr
    assert len(drain(tools, target.removeprefix("/queue/"))) == 3
    moved = cli(broker, "move", "--queue", forms[-1], "--to", f"{PREFIX}stompwire-{run}-parked",
                "--limit", "1")
    assert moved.returncode == 0, moved.stderr
    assert len(drain(tools, f"{PREFIX}stompwire-{run}-parked")) == 1
    purged = cli(broker, "purge", "--queue", forms[0], "--all")
    assert purged.returncode == 0, purged.stderr
    assert tools.size(dlq) == 0
    rules = tmp_path / "rules.txt"
    rules.write_text("ACTION(DISCARD)\n")
    handled = cli(broker, "handle", "--rules", str(rules), "--queue", forms[-1], "--once")
    assert handled.returncode == 0, handled.stderr
    topic = cli(broker, "count", "--queue", "/topic/x")
    assert topic.returncode != 0 and "not a queue" in topic.stderr, topic.stderr
    assert "Traceback" not in topic.stderr
