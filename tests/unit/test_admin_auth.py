"""Who may call the admin API: bearer tokens from a file, re-read when it changes."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bridge.app import auth
from bridge.app.admin import Admin
from bridge.app.auth import TokenFile
from bridge.app.cli import main
from bridge.app.config import resolve
from bridge.app.metrics import Metrics
from policies.endpoints import Endpoint
from policies.errors import ConfigError
from tests.unit.memory_broker import MemoryBroker

TOKEN = "s3cret-token"
PROTECTED = [("GET", "/staged"), ("GET", "/staged?target=/queue/a"),
             ("POST", "/staged/ID:1/cancel"), ("POST", "/staged/ID:1/release"),
             ("GET", "/policy?destination=/queue/a")]
PUBLIC = ["/healthz", "/readyz", "/metrics"]


def admin(tokens: TokenFile | None, with_broker: bool = True) -> Admin:
    """An Admin over an empty in-memory staging area (or none: its endpoints answer 503)."""
    broker = MemoryBroker()
    return Admin(metrics=Metrics(), broker="rabbitmq", upstream=Endpoint("127.0.0.1", 1),
                 staging=(lambda: broker) if with_broker else None,  # type: ignore[arg-type,return-value]
                 tokens=tokens)


def calls(tokens: TokenFile | None,
          body: Callable[[TestClient[Any, Any]], Awaitable[None]], with_broker: bool = True
          ) -> None:
    async def run() -> None:
        async with TestClient(TestServer(admin(tokens, with_broker).app)) as client:
            await body(client)

    asyncio.run(run())


def token_file(tmp_path: Path, text: str = TOKEN + "\n") -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    return path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_with_a_token_every_endpoint_but_probes_and_metrics_wants_it(tmp_path: Path) -> None:
    tokens = TokenFile(str(token_file(tmp_path)))

    async def body(client: TestClient[Any, Any]) -> None:
        for method, path in PROTECTED:
            for headers, error in [({}, None), (bearer("wrong"), "invalid_token"),
                                   ({"Authorization": f"Basic {TOKEN}"}, None),
                                   ({"Authorization": "Bearer "}, None)]:
                r = await client.request(method, path, headers=headers)
                assert r.status == 401, (method, path, headers)
                challenge = r.headers["WWW-Authenticate"]
                assert challenge.startswith("Bearer ")
                assert ('error="invalid_token"' in challenge) == (error is not None)
                assert "error" in await r.json()
        for path in PUBLIC:
            r = await client.get(path)
            assert r.status in (200, 503), path  # /readyz: nothing listens on port 1
        r = await client.get("/staged", headers=bearer(TOKEN))
        assert r.status == 503
        r = await client.get("/staged", headers={"Authorization": f"bearer {TOKEN}"})
        assert r.status == 503  # the scheme is case-insensitive (RFC 7235)
        for action in ("cancel", "release"):  # let through: this admin has no broker
            r = await client.post(f"/staged/ID:nope/{action}", headers=bearer(TOKEN))
            assert r.status == 503 and "no staging broker" in (await r.json())["error"]
        r = await client.get("/policy?destination=/queue/a", headers=bearer(TOKEN))
        assert r.status == 200
        r = await client.get("/nowhere")  # no telling which paths exist without a token
        assert r.status == 401
        r = await client.get("/nowhere", headers=bearer(TOKEN))
        assert r.status == 404

    calls(tokens, body, with_broker=False)

    # The staged-message handlers themselves, behind the token.
    async def staged(client: TestClient[Any, Any]) -> None:
        r = await client.get("/staged?message_id=ID:x", headers=bearer(TOKEN))
        assert r.status == 200 and await r.json() == []

    calls(tokens, staged)


def test_without_a_token_staged_endpoints_are_refused_and_policy_is_open() -> None:
    async def body(client: TestClient[Any, Any]) -> None:
        for method, path in PROTECTED[:-1]:
            r = await client.request(method, path, headers=bearer(TOKEN))
            assert r.status == 403, path
            assert "--admin-token-file" in (await r.json())["error"]
        r = await client.get("/policy?destination=/queue/a")
        assert r.status == 200
        for path in PUBLIC:
            assert (await client.get(path)).status in (200, 503)

    calls(None, body)


def test_the_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    tokens = TokenFile(str(path))

    async def body(client: TestClient[Any, Any]) -> None:
        assert (await client.get("/staged", headers=bearer(TOKEN))).status == 200
        # A rotation as Kubernetes does it: a new file renamed over the old one.
        new = tmp_path / "token.new"
        new.write_text("rotated\n")
        os.replace(new, path)
        assert (await client.get("/staged", headers=bearer(TOKEN))).status == 401
        assert (await client.get("/staged", headers=bearer("rotated"))).status == 200
        # Two tokens while clients move over; an in-place rewrite with the same mtime counts.
        stat = path.stat()
        path.write_text("rotated\nnext\n")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert (await client.get("/staged", headers=bearer("next"))).status == 200
        assert (await client.get("/staged", headers=bearer("rotated"))).status == 200
        # Emptied or gone: nobody gets in (fails closed) until it is fixed.
        path.write_text("\n")
        assert tokens.problem is None
        assert (await client.get("/staged", headers=bearer("rotated"))).status == 401
        assert tokens.problem is not None and "no token" in tokens.problem
        path.unlink()
        assert (await client.get("/staged", headers=bearer("rotated"))).status == 401
        assert tokens.problem is not None and "cannot read" in tokens.problem
        path.write_text("back\n")
        assert (await client.get("/staged", headers=bearer("back"))).status == 200
        assert tokens.problem is None

    calls(tokens, body)


@pytest.mark.parametrize("text", ["", "\n \n"])
def test_an_empty_file_is_a_startup_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="holds no token"):
        TokenFile(str(token_file(tmp_path, text)))


def test_a_missing_or_unreadable_file_is_a_startup_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        TokenFile(str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="cannot read it"):
        TokenFile(str(tmp_path))  # a directory
    with pytest.raises(ConfigError, match="not UTF-8"):
        binary = tmp_path / "binary"
        binary.write_bytes(b"\xff\xfe\n")
        TokenFile(str(binary))


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    seen: list[tuple[bytes, bytes]] = []

    def compare(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return a == b

    monkeypatch.setattr(auth.hmac, "compare_digest", compare)  # type: ignore[attr-defined]
    tokens = TokenFile(str(token_file(tmp_path, "one\ntwo\n")))
    assert tokens.accepts("one")  # every token is compared, even after a match
    assert seen == [(b"one", b"one"), (b"one", b"two")]
    assert not tokens.accepts("énorme")  # non-ASCII is compared as bytes, not an error


def test_settings_from_flag_file_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "bridge.yaml"
    config.write_text("admin-token-file: /etc/jms-bridge/token\n")
    assert resolve({}, config_file=str(config), environ={}).admin_token_file == \
        "/etc/jms-bridge/token"
    env = {"JMS_BRIDGE_ADMIN_TOKEN_FILE": "/run/token"}
    assert resolve({}, environ=env).admin_token_file == "/run/token"
    assert resolve({"admin-token-file": "/flag"}, environ=env).admin_token_file == "/flag"
    assert resolve({}, environ={}).admin_token_file is None
    with pytest.raises(ConfigError, match="admin-token-file"):
        resolve({}, environ={"JMS_BRIDGE_ADMIN_TOKEN_FILE": " "})


def test_run_with_an_unusable_token_file_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path in (tmp_path / "absent", token_file(tmp_path, "")):
        code = main(["run", "--admin-token-file", str(path),
                     "--upstream-stomp", "stomp://127.0.0.1:1"])
        err = capsys.readouterr().err
        assert code == 1
        assert err.count("\n") == 1 and err.startswith("jms-bridge: admin-token-file"), err
