"""Whether a broker answers: a TCP connection, or AMQP's protocol header answered. Apart from
the admin API (and its aiohttp) so that the broker watch needs neither."""

from __future__ import annotations

import asyncio
import ssl

from bridge.frontends.amqp.builders import PROTOCOL_HEADER
from policies.endpoints import Endpoint


async def probe(target: Endpoint, timeout: float = 2.0) -> str | None:
    """None when a TCP connection to ``target`` (or to one of its alternates) opens, else why
    not."""
    problem = ""
    for node in target.every():
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(node.host, node.port), timeout
            )
        except (TimeoutError, OSError) as exc:
            problem = str(exc) or type(exc).__name__
            continue
        writer.close()
        return None
    return problem


async def probe_amqp(target: Endpoint, timeout: float = 2.0,
                     tls: ssl.SSLContext | None = None) -> str | None:
    """None when ``target`` (or one of its alternates) answers AMQP 0-9-1's protocol header
    with a Connection.Start (a method frame), over TLS with ``tls``; else why not (the last
    node's reason)."""
    problem = ""
    for node in target.every():
        problem = await _answers_amqp(node, timeout, tls)
        if not problem:
            return None
    return problem


async def _answers_amqp(node: Endpoint, timeout: float, tls: ssl.SSLContext | None) -> str:
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(node.host, node.port, ssl=tls,
                                    server_hostname=node.host if tls else None), timeout
        )
    except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
        return str(exc) or type(exc).__name__
    try:
        writer.write(PROTOCOL_HEADER)
        first = await asyncio.wait_for(reader.read(1), timeout)
    except (TimeoutError, OSError) as exc:
        return f"no answer to the AMQP protocol header: {exc or type(exc).__name__}"
    finally:
        writer.close()
    if first != b"\x01":
        return f"answered the AMQP protocol header with {first!r}, not Connection.Start"
    return ""
