"""The browser console at ``/console/``: three static files from the package
(``bridge/app/console/``), no build step, nothing fetched from elsewhere.

The page itself is served without the admin token (it holds no data); every call it makes for
data goes to the JSON API with ``Authorization: Bearer <token>``, the token typed into the page
or given in the URL fragment (``#token=...``), which never reaches a server or its logs.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

PREFIX = "/console"
# Only these files, by name: no directory listing, no path taken from the request.
FILES = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
# The page runs only its own script and talks only to this listener; no framing, no referrer.
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self'; connect-src 'self'; form-action 'none'; "
                                "base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (resources.files("bridge.app") / "console" / name).read_bytes()


def public(path: str) -> bool:
    """Whether the admin listener serves ``path`` without the token (the page's files)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


async def _index_redirect(request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently(PREFIX + "/")


async def _file(request: web.Request) -> web.Response:
    name = request.match_info.get("name") or "index.html"
    if name not in FILES:
        raise web.HTTPNotFound()
    return web.Response(body=_read(name), headers={"Content-Type": FILES[name], **HEADERS})


def install(app: web.Application) -> None:
    app.add_routes([
        web.get(PREFIX, _index_redirect),
        web.get(PREFIX + "/", _file),
        web.get(PREFIX + "/{name}", _file),
    ])
