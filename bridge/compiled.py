"""The AMQP path's hot modules, compiled with mypyc where a build of them is current.

Besides the front-end's own: the staged copy's envelope, the delay policy, the reading of a
property's meaning (``policies.properties``) and RabbitMQ's mapping of STOMP headers to AMQP
properties and back, which every delayed publish runs through.

``scripts/compile`` (run by ``scripts/setup``) compiles ``MODULES`` with mypyc into extension
modules under ``build/native/`` (``BUILD``), laid out as their packages are, one shared library
for them all (``bridge/_native__mypyc*.so`` there), and writes ``build/native/stamp.json``: each
source's SHA-256 and the Python that built them. Nothing compiled lies beside a source, so an
import that nobody steers finds the source: a module of ``adapters`` or ``policies`` imported
before ``bridge`` (they may not import it) is its source file, never an unchecked build.

The build is taken only whole and only while it matches the sources. ``install()``, called when
the ``bridge`` package is imported, checks every source file of ``PACKAGES`` against the stamp:
the compiled modules' own, and those of the modules they import (mypyc may take a constant of
one into the C it writes). Only when every one matches, every extension module is there,
``JMS_BRIDGE_PURE`` is unset (or ``0``) and none of ``MODULES`` was imported before (from its
source, then), it puts a finder first on ``sys.meta_path`` that imports all of them from the
build. All or none: compiled modules call each other inside their shared library, past the
module objects, so one module from its source and one compiled could run two versions of the
code.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

MODULES = (
    "bridge.frontends.amqp.octets",
    "bridge.frontends.amqp.framer",
    "bridge.frontends.amqp.fastpath",
    "bridge.frontends.amqp.tables",
    "bridge.frontends.amqp.properties",
    "bridge.frontends.amqp.builders",
    "bridge.frontends.amqp.assembler",
    "bridge.frontends.amqp.connection",
    "bridge.frontends.amqp.translate",
    "bridge.frontends.amqp.stamping",
    "bridge.frontends.amqp.consumers",
    "bridge.staging.envelope",
    "policies.delay",
    "adapters.rabbitmq_stomp",
    "adapters.amqp_types",
    "policies.properties",  # (last: the modules above import it, and a reason names the first)
)
GROUP = "bridge._native"  # the shared library: build/native/bridge/_native__mypyc.<abi>.so
LIBRARY = GROUP + "__mypyc"  # the module name its modules import it by
ROOT = Path(__file__).resolve().parent.parent  # holds bridge/
PURE_ENV = "JMS_BRIDGE_PURE"
PACKAGES = ("bridge", "adapters", "policies")  # every source a build depends on


def build_dir(root: Path = ROOT) -> Path:
    """Where ``scripts/compile`` leaves the extension modules and the stamp."""
    return root / "build" / "native"


BUILD = build_dir()
STAMP = BUILD / "stamp.json"


def source(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def digests(root: Path = ROOT, packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """Every source file of ``packages``, by its path under ``root``, and its SHA-256 (hex)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def stamp_text(modules: Sequence[str] = MODULES, root: Path = ROOT,
               packages: Sequence[str] = PACKAGES) -> str:
    """What ``scripts/compile`` writes to ``STAMP`` after a build."""
    return json.dumps({"python": sys.version, "modules": list(modules),
                       "sources": digests(root, packages)}, indent=1)


def extension(module: str, root: Path = ROOT) -> Path | None:
    """The build's extension module for ``module`` (None: there is none)."""
    base = build_dir(root).joinpath(*module.split("."))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        found = base.with_name(base.name + suffix)
        if found.exists():
            return found
    return None


def why_pure(modules: Sequence[str] = MODULES, root: Path = ROOT,
             packages: Sequence[str] = PACKAGES) -> str | None:
    """Why these modules run from their sources (None: the build is current and complete)."""
    flag = os.environ.get(PURE_ENV, "")
    if flag not in ("", "0"):
        return f"{PURE_ENV} is set"
    return stale(modules, root, packages)


def stale(modules: Sequence[str] = MODULES, root: Path = ROOT,
          packages: Sequence[str] = PACKAGES) -> str | None:
    """Why the build on disk cannot be taken (None: it is current and complete)."""
    stamp = build_dir(root) / STAMP.name
    try:
        built = json.loads(stamp.read_text())
    except FileNotFoundError:
        return "not compiled (scripts/compile builds them)"
    except (OSError, ValueError) as exc:
        return f"the build stamp {stamp} cannot be read: {exc}"
    if not isinstance(built, dict) or built.get("python") != sys.version:
        return "compiled for another Python"
    if built.get("modules") != list(modules):
        return "the build is of other modules (scripts/compile builds these)"
    try:
        now = digests(root, packages)
    except OSError as exc:
        return f"a source cannot be read: {exc}"
    then = built.get("sources")
    if not isinstance(then, dict):
        return f"the build stamp {stamp} names no sources"
    changed = sorted(name for name in now.keys() | then.keys() if now.get(name) != then.get(name))
    if changed:
        return (f"{changed[0]} changed since the build (scripts/compile builds it again)")
    missing = [m for m in (*modules, LIBRARY) if extension(m, root) is None]
    if missing:
        return f"{missing[0]} has no compiled module"
    return None


def imported_before(modules: Sequence[str] = MODULES) -> str | None:
    """Why a build can no longer be taken in this process (None: it still can)."""
    early = [m for m in (*modules, LIBRARY) if m in sys.modules]
    if early:
        return f"{early[0]} was imported (from its source) before the bridge"
    return None


class _FromBuild(importlib.abc.MetaPathFinder):
    """Imports the named modules from the build's extension modules."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


_state: dict[str, str | None] = {}


def install() -> None:
    """Decide, once per process, whether ``MODULES`` are imported compiled or from source."""
    if "why_pure" in _state:
        return
    reason = why_pure() or imported_before()
    _state["why_pure"] = reason
    if reason is None:
        files = {m: extension(m) for m in (*MODULES, LIBRARY)}
        sys.meta_path.insert(0, _FromBuild({m: f for m, f in files.items() if f is not None}))


def describe() -> str:
    """One line for the start-up log: compiled, or why not."""
    install()
    reason = _state["why_pure"]
    if reason is None:
        return f"{len(MODULES)} modules of the AMQP path compiled with mypyc"
    return f"pure Python: {reason}"
