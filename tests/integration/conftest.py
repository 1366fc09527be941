"""Fixtures for tests against the real brokers, with the real bridge in front of them."""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from tests.integration.bridgeproc import BridgeProcess, free_port, wait_port
from tests.integration.brokers import BROKERS, Broker, require
from tests.integration.certs import Authority, authority
from tests.integration.leftovers import remove_test_queues


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.integration)


LOG_TAIL = 4000  # characters of each log a failure report carries


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A failing test's report carries the end of the log of each bridge it was given and of
    its broker's log: what the bridge and the broker said is often the only clue to a failure
    seen once in CI."""
    outcome = yield
    report = outcome.get_result()
    if report.passed or report.skipped:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, BridgeProcess):
            try:
                text = value.log()[-LOG_TAIL:]
            except OSError as exc:
                text = f"(unreadable: {exc})"
            report.sections.append((f"bridge log ({name}), its end", text))
        elif isinstance(value, Broker) and value.log:
            try:
                with open(value.log, "rb") as f:
                    f.seek(0, 2)
                    f.seek(max(0, f.tell() - LOG_TAIL))
                    text = f.read().decode("utf-8", "replace")
            except OSError as exc:
                text = f"(unreadable: {exc})"
            report.sections.append((f"{value.name} log, its end", text))


@pytest.fixture(params=sorted(BROKERS), scope="session")
def broker(request: pytest.FixtureRequest) -> Broker:
    b = BROKERS[request.param]
    require(b)
    return b


@pytest.fixture(scope="session")
def bridge(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BridgeProcess]:
    """One bridge per broker, shared by the tests that only relay traffic."""
    log = tmp_path_factory.mktemp("bridge") / f"{broker.name}.log"
    extra = []
    if broker.management_url:  # RabbitMQ: queue length limits are seen through it
        extra = ["--upstream-management",
                 broker.management_url.replace("://", "://guest:guest@", 1)]
    proc = BridgeProcess(
        broker.name, f"{broker.stomp_host}:{broker.stomp_port}", log, extra=extra
    ).start()
    yield proc
    code = proc.stop()
    assert code == 0, f"bridge exited {code} on SIGTERM; log:\n{proc.log()}"


@pytest.fixture(scope="session")
def amqp_bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgeProcess]:
    """A bridge on RabbitMQ with its AMQP 0-9-1 listener on (``amqp_port``), shared by the
    tests of AMQP clients that need no configuration of their own. Its staging queues are its
    own (``staging_prefix``): another bridge on the same broker (another test session's) must
    not release its staged messages."""
    broker = BROKERS["rabbitmq"]
    require(broker)
    port = free_port()
    prefix = f"jbt-staging-{uuid.uuid4().hex[:8]}"
    proc = BridgeProcess("rabbitmq", f"{broker.stomp_host}:{broker.stomp_port}",
                         tmp_path_factory.mktemp("amqp") / "bridge.log",
                         extra=["--amqp-listen", f"127.0.0.1:{port}",
                                "--staging-prefix", prefix])
    proc.amqp_port = port  # type: ignore[attr-defined]
    proc.staging_prefix = prefix
    proc.start()
    # The AMQP listener opens after the STOMP one that start() waits for.
    assert wait_port(port, 20, proc.proc), proc.log()
    yield proc
    assert proc.stop() == 0, proc.log()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    """A certificate authority made for the module's TLS tests."""
    return authority(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses."""
    return f"jbt-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session", autouse=True)
def _remove_test_queues() -> Iterator[None]:
    """At the end, the test queues nobody has used for a while (``leftovers``)."""
    yield
    remove_test_queues()
