"""Send-time checks of a delayed message's target, with the sending user's own credentials.

IBM MQ checks at put time that the user may put to the target queue, and that the queue exists.
A delayed SEND through the bridge is sent to a staging queue, so the broker checks that user
against the staging queue only, and a refused target would surface only at release, long after
the application was told its send went through. So before the first delayed send of a user to a
target, the bridge asks the broker, as that user (a probe that puts nothing: see the adapters'
``check_put``), and remembers the answer for ``ttl_s`` seconds, or for ``FULL_TTL_S`` when it
depends on how full the target is.

A probe that cannot tell (the broker is unreachable that way, the probe timed out) lets sends
through for ``UNSURE_TTL_S``: the broker still refuses such a message at release, and the engine
moves it to the undeliverable queue with the broker's reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

import structlog

from adapters.base import PutCheck
from policies.errors import BrokerUnavailable

VERDICT_TTL_S = 30.0
UNSURE_TTL_S = 5.0
# A queue with a length limit fills and drains: what is known of it is asked again after a
# second, where who the user is, or whether the target exists, holds for VERDICT_TTL_S.
FULL_TTL_S = 1.0


class TargetKey:
    """Who sends to where. The passcode travels with it for the probe, but two sessions of the
    same user share one verdict (the broker authenticated both). Immutable, and hashed once:
    one is made and looked up for each delayed send (a frozen dataclass cost five times as
    much, and hashed its fields again at each lookup)."""

    __slots__ = ("login", "vhost", "destination", "passcode", "_hash")

    def __init__(self, login: str | None, vhost: str | None, destination: str,
                 passcode: str | None = None) -> None:
        setter = object.__setattr__
        setter(self, "login", login)
        setter(self, "vhost", vhost)
        setter(self, "destination", destination)
        setter(self, "passcode", passcode)
        setter(self, "_hash", hash((login, vhost, destination)))

    login: str | None
    vhost: str | None
    destination: str
    passcode: str | None
    _hash: int

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"TargetKey is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not TargetKey:
            return NotImplemented
        return (self.login == other.login and self.vhost == other.vhost
                and self.destination == other.destination)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return (f"TargetKey(login={self.login!r}, vhost={self.vhost!r}, "
                f"destination={self.destination!r})")


class Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = Unknown()
PASSES = PutCheck()

# A probe: would the broker take this user's message for this destination? A PutCheck, or
# BrokerUnavailable (cannot tell). Blocking; run off the event loop.
Probe = Callable[[TargetKey], PutCheck]


class TargetChecks:
    """Remembered verdicts (read by the interceptor, synchronously) and the probes that make
    them (run by the front-end's glue, one at a time per key)."""

    def __init__(
        self,
        probe: Probe,
        *,
        needs_probe: Callable[[str], bool] = lambda destination: True,
        ttl_s: float = VERDICT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.probe = probe
        self.needs_probe = needs_probe
        self.ttl_s = ttl_s
        self.clock = clock
        self._verdicts: dict[TargetKey, tuple[float, PutCheck]] = {}
        self._needs: dict[str, bool] = {}  # needs_probe's answers (a destination's route)
        self._running: dict[TargetKey, asyncio.Future[None]] = {}
        self._log = structlog.get_logger("staging.targets")

    def verdict(self, key: TargetKey) -> PutCheck | Unknown:
        """The remembered verdict, or UNKNOWN when there is none that is fresh."""
        needs = self._needs.get(key.destination)
        if needs is None:
            needs = self.needs_probe(key.destination)
            if len(self._needs) >= 4096:
                self._needs.clear()
            self._needs[key.destination] = needs
        if not needs:
            return PASSES
        entry = self._verdicts.get(key)
        if entry is None:
            return UNKNOWN
        until, verdict = entry
        if self.clock() >= until:
            del self._verdicts[key]
            return UNKNOWN
        return verdict

    def remember(self, key: TargetKey, verdict: PutCheck, ttl_s: float | None = None) -> None:
        self._verdicts[key] = (self.clock() + (self.ttl_s if ttl_s is None else ttl_s), verdict)
        if len(self._verdicts) > 10_000:  # many users x many targets: drop the stale ones
            now = self.clock()
            self._verdicts = {k: v for k, v in self._verdicts.items() if v[0] > now}

    def judge(self, key: TargetKey) -> PutCheck:
        """Run the probe for ``key`` (blocking) and remember its answer; a probe that cannot
        tell lets sends through for a short while."""
        try:
            verdict = self.probe(key)
        except BrokerUnavailable as exc:
            self._log.warning("target not checked", destination=key.destination,
                              login=key.login, error=str(exc))
            self.remember(key, PASSES, UNSURE_TTL_S)
            return PASSES
        self.remember(key, verdict, FULL_TTL_S if verdict.changing else None)
        if verdict.refused is not None:
            self._log.info("target refused", destination=key.destination, login=key.login,
                           reason=verdict.refused.reason.name, detail=verdict.refused.detail)
        return verdict

    async def check(self, key: TargetKey) -> None:
        """``judge`` in a worker thread; concurrent checks of one key share a probe. Never
        raises: a probe that fails unexpectedly lets sends to that target through for 1 s."""
        running = self._running.get(key)
        if running is not None:
            await asyncio.shield(running)
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._running[key] = future
        try:
            await loop.run_in_executor(None, self.judge, key)
        except Exception as exc:  # never leave a client's frames held: let sends through
            self._log.error("target check failed", destination=key.destination,
                            error=repr(exc))
            self.remember(key, PASSES, 1.0)
        finally:
            del self._running[key]
            future.set_result(None)
