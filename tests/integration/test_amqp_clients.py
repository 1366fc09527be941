"""AMQP 0-9-1 clients of three ecosystems through the bridge to the real RabbitMQ: pika (its
asyncio adapter; the blocking one is in test_amqp_bridge and test_amqp_consumers), aio-pika,
Node's amqplib, and two command-line clients, the RabbitMQ Java client (Debian's
librabbitmq-client-java, run as a single-file Java program) and amqp-tools.

Each publishes with confirms, consumes (JMSXDeliveryCount 1, then 2 after a nack with
requeue), commits and rolls back a transaction, sends a delayed message and sees it arrive no
earlier than its delay, and sees a refused one refused (406, MQRC_OPTIONS_ERROR). amqp-tools
has no confirms, transactions or nacks: it publishes, gets, consumes, delays and is refused.
``scripts/install-test-deps`` installs what these need.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest
from pika.adapters.asyncio_connection import AsyncioConnection

from tests.integration.bridgeproc import BridgeProcess

CLIENTS = Path(__file__).parents[1] / "clients" / "amqp"
JAVA_CLASSPATH = "/usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar"
DELAY_MS = 600


@pytest.fixture
def amqp_queue(amqp_bridge: BridgeProcess) -> Iterator[str]:
    name = f"jbt-clients-{uuid.uuid4().hex[:10]}"
    yield name
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", amqp_bridge.amqp_port))  # type: ignore[attr-defined]
    conn.channel().queue_delete(name)
    conn.close()


def _check(found: dict[str, Any]) -> None:
    """What every client must have seen (the keys each client script prints)."""
    assert "error" not in found, found
    # A first delivery is the broker's bytes: no JMSXDeliveryCount the application never sent.
    assert found["plain"] == "plain" and found.get("plain_count") is None and found["n"] == 1, \
        found
    assert found["nacked_count"] == 2, found
    assert found["tx"] == "committed" and found["tx_left"] == 0, found
    assert found["early"] is False and found["delayed"] == "later", found
    assert found["waited_ms"] >= DELAY_MS, found
    assert found["refused"].startswith("406 MQRC_OPTIONS_ERROR (2046)"), found


# -- pika's asyncio adapter --------------------------------------------------------------------
class _PikaAsync:
    """Callbacks of pika's AsyncioConnection turned into awaitables, just enough for the test."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.loop = asyncio.get_running_loop()

    async def connect(self) -> AsyncioConnection:
        opened: asyncio.Future[AsyncioConnection] = self.loop.create_future()
        AsyncioConnection(
            pika.ConnectionParameters("127.0.0.1", self.port),
            on_open_callback=opened.set_result,
            on_open_error_callback=lambda _c, exc: opened.set_exception(exc),
            custom_ioloop=self.loop)
        return await opened

    async def channel(self, conn: AsyncioConnection) -> Any:
        opened: asyncio.Future[Any] = self.loop.create_future()
        conn.channel(on_open_callback=opened.set_result)
        return await opened

    def call(self, method: Any, *args: Any, **kwargs: Any) -> asyncio.Future[Any]:
        """Call a pika channel method that takes a ``callback`` and await it."""
        done: asyncio.Future[Any] = self.loop.create_future()
        method(*args, callback=lambda frame: done.done() or done.set_result(frame), **kwargs)
        return done

    async def get(self, ch: Any, queue: str, timeout: float = 10.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            got: asyncio.Future[Any] = self.loop.create_future()

            def answer(result: Any, got: asyncio.Future[Any] = got) -> None:
                if not got.done():
                    got.set_result(result)

            ch.add_callback(lambda _frame: answer(None), [pika.spec.Basic.GetEmpty])
            ch.basic_get(queue, lambda _ch, m, p, b: answer((m, p, b)))
            found = await asyncio.wait_for(got, 5)
            if found is not None or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.02)


async def _pika_asyncio(port: int, queue: str) -> dict[str, Any]:
    p = _PikaAsync(port)
    conn = await p.connect()
    ch = await p.channel(conn)
    await p.call(ch.queue_declare, queue, durable=True)
    confirms: asyncio.Queue[Any] = asyncio.Queue()
    await p.call(ch.confirm_delivery, lambda frame: confirms.put_nowait(frame))
    ch.basic_publish("", queue, b"plain", pika.BasicProperties(headers={"n": 1}))
    await asyncio.wait_for(confirms.get(), 5)
    out: dict[str, Any] = {}
    m, props, body = await p.get(ch, queue)
    out.update(plain=body.decode(), plain_count=props.headers.get("JMSXDeliveryCount"),
               n=props.headers["n"])
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, props, _ = await p.get(ch, queue)
    out["nacked_count"] = props.headers["JMSXDeliveryCount"]
    ch.basic_ack(m.delivery_tag)
    tx = await p.channel(conn)
    await p.call(tx.tx_select)
    tx.basic_publish("", queue, b"rolled back")
    await p.call(tx.tx_rollback)
    tx.basic_publish("", queue, b"committed")
    await p.call(tx.tx_commit)
    m, _, body = await p.get(ch, queue)
    out["tx"] = body.decode()
    ch.basic_ack(m.delivery_tag)
    declared = await p.call(ch.queue_declare, queue, passive=True)
    out["tx_left"] = declared.method.message_count
    sent = time.monotonic()
    ch.basic_publish("", queue, b"later", pika.BasicProperties(headers={"x-delay": DELAY_MS}))
    await asyncio.wait_for(confirms.get(), 5)
    out["early"] = await p.get(ch, queue, timeout=0.05) is not None
    m, _, body = await p.get(ch, queue)
    out.update(delayed=body.decode(), waited_ms=(time.monotonic() - sent) * 1000)
    ch.basic_ack(m.delivery_tag)
    refused = await p.channel(conn)
    closed: asyncio.Future[Any] = p.loop.create_future()
    refused.add_on_close_callback(lambda _ch, reason: closed.set_result(reason))
    await p.call(refused.confirm_delivery, lambda frame: None)
    refused.basic_publish("", queue, b"no", pika.BasicProperties(headers={"x-delay": -5}))
    reason = await asyncio.wait_for(closed, 5)
    out["refused"] = f"{reason.reply_code} {reason.reply_text}"
    conn.close()
    return out


def test_pika_asyncio_adapter(amqp_bridge: BridgeProcess, amqp_queue: str) -> None:
    _check(asyncio.run(_pika_asyncio(amqp_bridge.amqp_port, amqp_queue)))  # type: ignore[attr-defined]


# -- aio-pika ----------------------------------------------------------------------------------
async def _aio_pika(port: int, queue: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue(queue, durable=True)

        async def get(timeout: float = 10.0) -> aio_pika.abc.AbstractIncomingMessage:
            deadline = time.monotonic() + timeout
            while True:
                m = await q.get(fail=False)
                if m is not None or time.monotonic() > deadline:
                    assert m is not None, "nothing came"
                    return m
                await asyncio.sleep(0.02)

        await ch.default_exchange.publish(aio_pika.Message(b"plain", headers={"n": 1}), queue)
        m = await get()
        out.update(plain=m.body.decode(), plain_count=m.headers.get("JMSXDeliveryCount"),
                   n=m.headers["n"])
        await m.nack(requeue=True)
        m = await get()
        out["nacked_count"] = m.headers["JMSXDeliveryCount"]
        await m.ack()
        tx_ch = await conn.channel(publisher_confirms=False)
        tx = tx_ch.transaction()
        await tx.select()
        await tx_ch.default_exchange.publish(aio_pika.Message(b"rolled back"), queue)
        await tx.rollback()
        await tx_ch.default_exchange.publish(aio_pika.Message(b"committed"), queue)
        await tx.commit()
        m = await get()
        out["tx"] = m.body.decode()
        await m.ack()
        out["tx_left"] = (await ch.declare_queue(queue, passive=True)).declaration_result \
            .message_count
        sent = time.monotonic()
        await ch.default_exchange.publish(
            aio_pika.Message(b"later", headers={"x-delay": DELAY_MS}), queue)
        out["early"] = await q.get(fail=False) is not None
        m = await get()
        out.update(delayed=m.body.decode(), waited_ms=(time.monotonic() - sent) * 1000)
        await m.ack()
        refused = await conn.channel(publisher_confirms=True)
        try:
            await refused.default_exchange.publish(
                # a string: pamqp 3.3, under aio-pika, cannot write -5 in a table
                aio_pika.Message(b"no", headers={"x-delay": "-5"}), queue)
            out["refused"] = "published"
        except aio_pika.exceptions.ChannelPreconditionFailed as exc:
            code, text = exc.args[0], exc.args[1] if len(exc.args) > 1 else ""
            out["refused"] = f"{code} {text}" if isinstance(code, int) else str(exc)
    return out


def test_aio_pika(amqp_bridge: BridgeProcess, amqp_queue: str) -> None:
    found = asyncio.run(_aio_pika(amqp_bridge.amqp_port, amqp_queue))  # type: ignore[attr-defined]
    if not found["refused"].startswith("406"):  # aiormq words its exception its own way
        assert "MQRC_OPTIONS_ERROR (2046)" in found["refused"], found
        found["refused"] = "406 MQRC_OPTIONS_ERROR (2046)"
    _check(found)


# -- Node's amqplib ----------------------------------------------------------------------------
def test_node_amqplib(amqp_bridge: BridgeProcess, amqp_queue: str) -> None:
    if not (CLIENTS / "node_modules" / "amqplib").is_dir():
        pytest.fail("amqplib is not installed: run scripts/install-test-deps", pytrace=False)
    run = subprocess.run(["node", str(CLIENTS / "roundtrip.js"),
                          str(amqp_bridge.amqp_port), amqp_queue],  # type: ignore[attr-defined]
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    refused = found["refused"] or {}
    _check({
        "plain": found["plain"]["body"], "plain_count": found["plain"].get("count"),
        "n": found["plain"]["n"], "nacked_count": found["nacked"]["count"],
        "tx": found["tx"], "tx_left": found["tx_left"], "early": found["early"],
        "delayed": found["delayed"]["body"], "waited_ms": found["delayed"]["waited_ms"],
        "refused": f"{refused.get('code')} " + refused.get("message", "").partition(
            'with message "')[2].rstrip('"'),
    })


# -- command-line clients -----------------------------------------------------------------------
def test_the_rabbitmq_java_client(amqp_bridge: BridgeProcess, amqp_queue: str) -> None:
    if shutil.which("java") is None or not Path(JAVA_CLASSPATH.split(":")[0]).exists():
        pytest.fail("java or the RabbitMQ Java client is missing: run scripts/install-test-deps",
                    pytrace=False)
    run = subprocess.run(["java", "-cp", JAVA_CLASSPATH, str(CLIENTS / "RoundTrip.java"),
                          str(amqp_bridge.amqp_port), amqp_queue],  # type: ignore[attr-defined]
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    _check(json.loads(run.stdout.strip().splitlines()[-1]))


def test_amqp_tools(amqp_bridge: BridgeProcess, amqp_queue: str) -> None:
    if shutil.which("amqp-publish") is None:
        pytest.fail("amqp-tools is not installed: run scripts/install-test-deps", pytrace=False)
    url = f"amqp://guest:guest@127.0.0.1:{amqp_bridge.amqp_port}"  # type: ignore[attr-defined]

    def tool(*args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*args, "--url", url], capture_output=True, text=True,
                              timeout=timeout)

    assert tool("amqp-declare-queue", "-d", "-q", amqp_queue).returncode == 0
    assert tool("amqp-publish", "-r", amqp_queue, "-b", "plain", "-H", "n: 1").returncode == 0
    got = tool("amqp-get", "-q", amqp_queue)
    assert (got.returncode, got.stdout) == (0, "plain")
    sent = time.monotonic()
    assert tool("amqp-publish", "-r", amqp_queue, "-b", "later",
                "-H", f"x-delay: {DELAY_MS}").returncode == 0
    assert tool("amqp-get", "-q", amqp_queue).returncode != 0  # empty: not early
    consumed = tool("amqp-consume", "-q", amqp_queue, "-c", "1", "cat", timeout=20)
    assert (consumed.returncode, consumed.stdout) == (0, "later")
    assert time.monotonic() - sent >= DELAY_MS / 1000
    refused = tool("amqp-publish", "-r", amqp_queue, "-b", "no", "-H", "x-delay: -5")
    assert refused.returncode != 0
    assert "server channel error 406, message: MQRC_OPTIONS_ERROR (2046)" in refused.stderr
