"""The console's files: served by the admin app without the token (they hold no data), only
those files, with headers that keep the page to its own script; carried by a wheel (package
data); the page's script sends the token only as a bearer header, never in a URL."""

from __future__ import annotations

import asyncio
import configparser
import fnmatch
import re
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from bridge.app import webconsole
from bridge.app.admin import Admin
from bridge.app.auth import TokenFile
from bridge.app.metrics import Metrics
from policies.endpoints import Endpoint

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "bridge" / "app" / "console"


def fetch(tmp_path: Path, *paths: str) -> list[tuple[int, dict[str, str], bytes]]:
    (tmp_path / "token").write_text("console-token\n")
    admin = Admin(metrics=Metrics(), broker="rabbitmq", upstream=Endpoint("127.0.0.1", 1),
                  tokens=TokenFile(str(tmp_path / "token")))

    async def run() -> list[tuple[int, dict[str, str], bytes]]:
        got = []
        async with TestClient(TestServer(admin.app)) as client:
            for path in paths:
                r: Any = await client.get(path, allow_redirects=False)
                got.append((r.status, dict(r.headers), await r.read()))
        return got

    return asyncio.run(run())


def test_the_page_and_its_files_are_served_without_the_token(tmp_path: Path) -> None:
    page, script, style, bare = fetch(tmp_path, "/console/", "/console/console.js",
                                      "/console/console.css", "/console")
    assert page[0] == 200 and page[1]["Content-Type"].startswith("text/html")
    assert page[2] == (CONSOLE / "index.html").read_bytes()
    assert script[0] == 200 and script[1]["Content-Type"].startswith("text/javascript")
    assert style[0] == 200 and style[1]["Content-Type"].startswith("text/css")
    assert bare[0] == 301 and bare[1]["Location"] == "/console/"
    policy = page[1]["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy and page[1]["Referrer-Policy"] == "no-referrer"


def test_only_the_consoles_files(tmp_path: Path) -> None:
    for status, _, _ in fetch(tmp_path, "/console/..%2Fadmin.py", "/console/admin.py",
                              "/console/%2E%2E/journal.schema.json", "/console/x/index.html"):
        assert status in (401, 404), status
    # The data stays behind the token.
    ((status, _, _),) = fetch(tmp_path, "/consolex")
    assert status == 401
    assert webconsole.public("/console/") and not webconsole.public("/consolex")


def test_a_wheel_carries_the_files() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    globs = [g.strip() for g in cfg["options.package_data"]["bridge.app"].split(",")]
    names = sorted(p.name for p in CONSOLE.iterdir())
    assert names == sorted(webconsole.FILES)
    for name in names:
        assert any(fnmatch.fnmatch(f"console/{name}", g) for g in globs), name


def test_the_page_loads_nothing_from_elsewhere_and_keeps_the_token_out_of_urls() -> None:
    page = (CONSOLE / "index.html").read_text()
    script = (CONSOLE / "console.js").read_text()
    assert re.findall(r'(?:src|href)="([^"]+)"', page) == ["console.css", "console.js"]
    assert "http://" not in script.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in script and "innerHTML" not in script
    # The token goes out only in the Authorization header.
    uses = re.findall(r'.{0,10}token\(\)', script)
    assert uses and all(u.endswith(('" + token()', "if (!token()")) for u in uses), uses
    assert 'Authorization: "Bearer " + token()' in script
