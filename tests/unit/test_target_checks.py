"""Send-time target checks: the verdict cache, and a session holding frames while one runs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from adapters import rabbitmq
from adapters.base import PutCheck
from adapters.rabbitmq_checks import queue_check
from bridge.frontends.stomp import HEARTBEAT, FrameParser, serialize
from bridge.frontends.stomp.session import Session, State
from bridge.intercept.chain import Chain
from bridge.intercept.delay import DelayInterceptor
from bridge.staging.levels import Layout
from bridge.staging.targets import (
    FULL_TTL_S,
    PASSES,
    UNKNOWN,
    UNSURE_TTL_S,
    TargetChecks,
    TargetKey,
)
from policies.delay import DelayConfig
from policies.errors import BrokerUnavailable, Refused
from policies.reasons import MQRC_NOT_AUTHORIZED, MQRC_Q_FULL

NOW = 1_800_000_000_000
NO = PutCheck(Refused(MQRC_NOT_AUTHORIZED, "/topic/secret: the broker says no"))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Probe:
    """Answers from a table (destination -> check or exception), counting calls."""

    def __init__(self, answers: dict[str, PutCheck | Exception]) -> None:
        self.answers = answers
        self.calls: list[TargetKey] = []

    def __call__(self, key: TargetKey) -> PutCheck:
        self.calls.append(key)
        answer = self.answers[key.destination]
        if isinstance(answer, Exception):
            raise answer
        return answer


def key(destination: str, login: str = "app", passcode: str = "pw") -> TargetKey:
    return TargetKey(login, "/", destination, passcode)


# -- the verdict cache ----------------------------------------------------------------------------

def test_verdicts_are_remembered_for_their_ttl() -> None:
    clock = Clock()
    probe = Probe({"/topic/secret": NO, "/topic/open": PASSES})
    checks = TargetChecks(probe, ttl_s=30, clock=clock)
    assert checks.verdict(key("/topic/secret")) is UNKNOWN
    assert checks.judge(key("/topic/secret")) is NO
    assert checks.judge(key("/topic/open")) is PASSES
    clock.t += 29
    assert checks.verdict(key("/topic/secret")) is NO
    assert checks.verdict(key("/topic/open")) is PASSES
    clock.t += 1
    assert checks.verdict(key("/topic/secret")) is UNKNOWN
    assert len(probe.calls) == 2


@pytest.mark.parametrize("refused", [True, False])
def test_what_depends_on_how_full_a_queue_is_is_asked_again_soon(refused: bool) -> None:
    clock = Clock()
    full = Refused(MQRC_Q_FULL, "/queue/q: the broker says Usage Manager Memory Limit reached")
    check = PutCheck(full if refused else None, max_body_bytes=100, changing=True)
    checks = TargetChecks(Probe({"/queue/q": check}), ttl_s=30, clock=clock)
    assert checks.judge(key("/queue/q")) is check
    assert checks.verdict(key("/queue/q")) is check
    clock.t += FULL_TTL_S
    assert checks.verdict(key("/queue/q")) is UNKNOWN


def test_one_verdict_per_user_whatever_the_passcode() -> None:
    checks = TargetChecks(Probe({"/topic/secret": NO}), clock=Clock())
    checks.judge(key("/topic/secret", passcode="first"))
    assert checks.verdict(key("/topic/secret", passcode="second")) is NO
    assert checks.verdict(key("/topic/secret", login="other")) is UNKNOWN


def test_a_probe_that_cannot_tell_lets_sends_through_briefly() -> None:
    clock = Clock()
    checks = TargetChecks(Probe({"/topic/x": BrokerUnavailable("no AMQP")}), clock=clock)
    assert checks.judge(key("/topic/x")) is PASSES
    assert checks.verdict(key("/topic/x")) is PASSES
    clock.t += UNSURE_TTL_S
    assert checks.verdict(key("/topic/x")) is UNKNOWN


def test_destinations_the_staging_send_covers_are_not_probed() -> None:
    probe = Probe({})
    checks = TargetChecks(probe, needs_probe=lambda d: not d.startswith("/queue/"))
    assert checks.verdict(key("/queue/a")) is PASSES
    assert probe.calls == []


def test_whether_a_destination_needs_a_probe_is_asked_once() -> None:
    asked: list[str] = []

    def needs_probe(destination: str) -> bool:
        asked.append(destination)
        return not destination.startswith("/queue/")

    checks = TargetChecks(Probe({}), needs_probe=needs_probe)
    for _ in range(3):
        assert checks.verdict(key("/queue/a")) is PASSES
        assert checks.verdict(key("/topic/b")) is UNKNOWN
    assert asked == ["/queue/a", "/topic/b"]


def test_concurrent_checks_of_one_key_share_one_probe() -> None:
    release = threading.Event()
    calls: list[TargetKey] = []

    def slow_probe(k: TargetKey) -> PutCheck:
        calls.append(k)
        release.wait(5)
        return NO

    async def main() -> None:
        checks = TargetChecks(slow_probe)
        tasks = [asyncio.create_task(checks.check(key("/topic/secret"))) for _ in range(5)]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(*tasks)
        assert checks.verdict(key("/topic/secret")) is NO

    asyncio.run(main())
    assert len(calls) == 1


# -- the session holds the client's frames while a check runs ---------------------------------

def session(checks: TargetChecks) -> Session:
    icpt = DelayInterceptor(fmt=rabbitmq.FORMAT, config=DelayConfig(), layout=Layout(),
                            clock=lambda: NOW, targets=checks)
    s = Session(chain=Chain([icpt]))
    s.from_client(b"CONNECT\naccept-version:1.2\nhost:/\nlogin:app\npasscode:pw\n\n\x00")
    s.from_broker(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
    assert s.state is State.CONNECTED
    return s


def send(destination: str, *extra: tuple[str, str]) -> bytes:
    return serialize("SEND", [("destination", destination), *extra], b"body")


def commands(chunks: list[bytes]) -> list[tuple[str, str | None]]:
    frames = FrameParser(role="server", version="1.2").feed(b"".join(chunks))
    return [(f.command, f.get("destination")) for f in frames if f is not HEARTBEAT]  # type: ignore[union-attr]


def test_frames_after_a_checked_send_wait_for_it_and_keep_their_order() -> None:
    checks = TargetChecks(Probe({"/topic/open": PASSES}))
    s = session(checks)
    before = send("/queue/a", ("seq", "1"))
    delayed = send("/topic/open", ("x-delay", "5000"), ("receipt", "r2"))
    after = send("/queue/a", ("seq", "3"))
    out = s.from_client(before + delayed + after)
    assert out.to_broker == [before]
    assert out.check.key == key("/topic/open")
    assert s.checking
    later = send("/queue/a", ("seq", "4"))
    held = s.from_client(later + b"\n")
    assert held.to_broker == [] and held.check is None
    checks.judge(key("/topic/open"))
    resumed = s.resume()
    assert not s.checking and resumed.close is None
    assert commands(resumed.to_broker) == [
        ("SEND", "/amq/queue/jms-bridge.staging.L12"),
        ("SEND", "/queue/a"),
        ("SEND", "/queue/a"),
    ]
    assert resumed.to_broker[1] == after and resumed.to_broker[2] == later
    assert resumed.to_broker[3] == b"\n"
    assert s.stats.frames_up["SEND"] == 4  # the held SEND counted once


def test_a_refused_target_reaches_the_client_after_the_check() -> None:
    checks = TargetChecks(Probe({"/topic/secret": NO}))
    s = session(checks)
    out = s.from_client(send("/topic/secret", ("x-delay", "5000"), ("receipt", "r9")))
    assert out.check is not None
    checks.judge(key("/topic/secret"))
    resumed = s.resume()
    assert resumed.to_broker == []
    assert resumed.close is not None and s.state is State.CLOSED
    (error,) = FrameParser(role="client", version="1.2").feed(resumed.to_client[0])
    assert error.get("message", "").startswith("MQRC_NOT_AUTHORIZED")  # type: ignore[union-attr]
    assert error.get("reason-code") == "2035"  # type: ignore[union-attr]
    assert error.get("receipt-id") == "r9"  # type: ignore[union-attr]
    # the next send to the same place is refused at once, from the remembered verdict
    again = session(checks).from_client(send("/topic/secret", ("x-delay", "1")))
    assert again.check is None and again.close is not None


def test_a_second_check_among_held_frames_holds_the_rest_again() -> None:
    checks = TargetChecks(Probe({"/topic/one": PASSES, "/topic/two": PASSES}))
    s = session(checks)
    first = send("/topic/one", ("x-delay", "5000"))
    second = send("/topic/two", ("x-delay", "5000"))
    plain = send("/queue/a")
    assert s.from_client(first + second).check.key == key("/topic/one")
    s.from_client(plain)
    checks.judge(key("/topic/one"))
    out = s.resume()
    assert out.check.key == key("/topic/two") and len(out.to_broker) == 1
    checks.judge(key("/topic/two"))
    out = s.resume()
    assert commands(out.to_broker) == [
        ("SEND", "/amq/queue/jms-bridge.staging.L12"), ("SEND", "/queue/a")]


def test_a_malformed_frame_behind_a_held_send_is_reported_after_it() -> None:
    checks = TargetChecks(Probe({"/topic/open": PASSES}))
    s = session(checks)
    out = s.from_client(send("/topic/open", ("x-delay", "5000")) + b"SEND\nno colon\n\n\x00")
    assert out.check is not None and out.close is None
    checks.judge(key("/topic/open"))
    resumed = s.resume()
    assert len(resumed.to_broker) == 1  # the staged copy still goes up
    assert resumed.close is not None and b"header" in resumed.to_client[0]


@pytest.mark.parametrize("destination", ["/queue/a", "a"])
def test_undelayed_sends_never_wait_for_a_check(destination: str) -> None:
    probe = Probe({})
    s = session(TargetChecks(probe))
    raw = send(destination)
    assert s.from_client(raw).to_broker == [raw]
    assert probe.calls == []


def test_a_body_larger_than_the_target_takes_is_refused_and_a_smaller_one_staged() -> None:
    checks = TargetChecks(Probe({"/queue/small": PutCheck(max_body_bytes=10, changing=True)}))
    checks.judge(key("/queue/small"))
    big = session(checks).from_client(serialize("SEND", [
        ("destination", "/queue/small"), ("x-delay", "5000"), ("content-length", "11")],
        b"x" * 11))
    assert big.close is not None and b"MQRC_MSG_TOO_BIG_FOR_Q" in big.to_client[0]
    assert b"at most 10 bytes" in big.to_client[0]
    small = session(checks).from_client(serialize("SEND", [
        ("destination", "/queue/small"), ("x-delay", "5000"), ("content-length", "10")],
        b"x" * 10))
    assert small.close is None and commands(small.to_broker) == [
        ("SEND", "/amq/queue/jms-bridge.staging.L12")]


# -- RabbitMQ: what a queue's management view says of its limits --------------------------------

def info(
    arguments: object = None, policy: object = None, ready_bytes: int = 0
) -> dict[str, object]:
    return {"arguments": arguments or {}, "effective_policy_definition": policy or [],
            "message_bytes_ready": ready_bytes}


LIMITED = True  # the answer depends on how full the queue is


@pytest.mark.parametrize(("view", "ready", "reason", "max_bytes", "changing"), [
    (info(), 5, None, None, False),  # no limits
    (info({"x-max-length": 1}), 5, None, None, False),  # drop-head: never refuses
    (info({"x-max-length": 3, "x-overflow": "reject-publish"}), 2, None, None, LIMITED),
    (info({"x-max-length": 3, "x-overflow": "reject-publish"}), 3, "MQRC_Q_FULL", None, LIMITED),
    (info({"x-overflow": "reject-publish-dlx"}, {"max-length": 2}), 2, "MQRC_Q_FULL", None,
     LIMITED),
    (info({"x-max-length": 9}, {"max-length": 2, "overflow": "reject-publish"}), 2,
     "MQRC_Q_FULL", None, LIMITED),  # the lower limit holds
    (info({"x-overflow": "drop-head"}, {"max-length": 1, "overflow": "reject-publish"}), 4,
     None, None, False),  # the argument's overflow beats the policy's
    (info({"x-max-length-bytes": 100, "x-overflow": "reject-publish"}, ready_bytes=99), 1,
     None, 100, LIMITED),
    (info({"x-max-length-bytes": 100, "x-overflow": "reject-publish"}, ready_bytes=100), 1,
     "MQRC_Q_FULL", 100, LIMITED),
])
def test_rabbitmq_queue_limits(
    view: dict[str, object], ready: int, reason: str | None, max_bytes: int | None,
    changing: bool,
) -> None:
    check = queue_check("/queue/q", view, ready)
    assert (check.refused.reason.name if check.refused else None) == reason
    assert check.max_body_bytes == max_bytes
    assert check.changing == changing
