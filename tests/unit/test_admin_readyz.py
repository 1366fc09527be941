"""/readyz: the STOMP upstream, and the AMQP upstream too when the AMQP listener is on (it must
answer AMQP's protocol header with a Connection.Start, not merely accept a connection)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from bridge.app.admin import Admin
from bridge.app.metrics import Metrics
from policies.endpoints import Endpoint


async def _server(answer: bytes) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(8)
        writer.write(answer)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _ready(amqp_answer: bytes | None) -> tuple[int, dict[str, Any]]:
    async def run() -> tuple[int, dict[str, Any]]:
        stomp = await _server(b"")
        amqp = await _server(amqp_answer or b"")
        stomp_port = stomp.sockets[0].getsockname()[1]
        amqp_port = amqp.sockets[0].getsockname()[1]
        admin = Admin(metrics=Metrics(), broker="rabbitmq",
                      upstream=Endpoint("127.0.0.1", stomp_port),
                      upstream_amqp=Endpoint("127.0.0.1", amqp_port if amqp_answer else 1))
        async with TestClient(TestServer(admin.app)) as client:
            r = await client.get("/readyz")
            found = r.status, await r.json()
        stomp.close()
        amqp.close()
        return found

    return asyncio.run(run())


def test_ready_when_the_amqp_upstream_answers_with_a_method_frame() -> None:
    status, body = _ready(b"\x01\x00\x00")
    assert status == 200 and body["status"] == "ready" and "upstream_amqp" in body


def test_not_ready_when_the_amqp_upstream_is_away_or_not_amqp() -> None:
    status, body = _ready(None)
    assert status == 503 and body["problem"].startswith("AMQP: ")
    status, body = _ready(b"HTTP/1.1 400 Bad Request\r\n")
    assert status == 503 and "not Connection.Start" in body["problem"]
