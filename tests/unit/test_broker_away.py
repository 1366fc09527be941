"""What a client sees when the broker cannot be reached or goes away, without a network: the
session's ERROR frames carry the MQRC reason; the --upstream-wait setting; the file limit."""

from __future__ import annotations

import resource

import pytest

from bridge.app.config import resolve
from bridge.app.resources import needed, raise_open_files
from bridge.frontends.stomp import FrameParser
from bridge.frontends.stomp.session import Session, State
from policies.errors import ConfigError

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:u\npasscode:p\n\n\0"


def _error(data: list[bytes]) -> dict[str, str]:
    parser = FrameParser(role="client")
    (frame,) = parser.feed(b"".join(data))
    assert frame.command == "ERROR"  # type: ignore[union-attr]
    return dict(frame.headers)  # type: ignore[union-attr]


def test_a_connect_the_broker_cannot_take_gets_host_not_available() -> None:
    session = Session()
    session.from_client(CONNECT)
    out = session.broker_unreachable("rabbitmq STOMP at 127.0.0.1:1 is not reachable: refused")
    headers = _error(out.to_client)
    assert headers["message"].startswith("MQRC_HOST_NOT_AVAILABLE (2538): rabbitmq STOMP at")
    assert headers["reason-code"] == "2538" and headers["reason"] == "MQRC_HOST_NOT_AVAILABLE"
    assert out.close and session.state is State.CLOSED


def test_a_broker_that_goes_away_gets_connection_broken() -> None:
    session = Session()
    session.from_client(CONNECT)
    session.from_broker(b"CONNECTED\nversion:1.2\n\n\0")
    out = session.broker_lost("end of stream")
    headers = _error(out.to_client)
    assert headers["message"].startswith("MQRC_CONNECTION_BROKEN (2009)")
    assert headers["reason-code"] == "2009"
    assert session.broker_lost("again").to_client == []  # said once


@pytest.mark.parametrize(("given", "expected"), [("5", 5.0), ("0", 0.0), ("off", None),
                                                  ("2.5", 2.5)])
def test_upstream_wait(given: str, expected: float | None) -> None:
    assert resolve({"upstream-wait": given}, environ={}).upstream_wait == expected


def test_upstream_wait_default_is_to_wait_for_ever() -> None:
    assert resolve({}, environ={}).upstream_wait is None


@pytest.mark.parametrize("given", ["-1", "soon", "3601"])
def test_bad_upstream_wait(given: str) -> None:
    with pytest.raises(ConfigError, match="upstream-wait"):
        resolve({"upstream-wait": given}, environ={})


def test_open_file_limit_is_raised_to_the_hard_limit() -> None:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, before[1]))
        soft, hard = raise_open_files()
        assert hard == before[1]
        assert soft == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
    assert needed(10_000) > 20_000
