"""The AMQP front-end's hot modules, compiled with mypyc where a build of them is current.

``scripts/compile`` (run by ``scripts/setup``) compiles ``MODULES`` with mypyc into extension
modules beside their sources, one shared library for them all (``bridge/_native__mypyc*.so``),
and writes ``STAMP``: each source's SHA-256 and the Python that built them. Python imports an
extension module before a source file of the same name, so those modules then run as C: a
delayed publish costs the front-end about a third less.

The build is taken only whole and only while it matches the sources. ``install()``, called when
the ``bridge`` package is imported (before any of them can be), checks every source file of
``PACKAGES`` against the stamp: the compiled modules' own, and those of the modules they import
(mypyc may take a constant of one into the C it writes). When one differs (a source edited,
added or removed since the build), when the stamp or a module's extension is missing, or when
``JMS_BRIDGE_PURE`` is set to anything but ``0`` or an empty value, it puts a finder first on
``sys.meta_path`` that imports all of them from their sources. All or none: compiled modules
call each other inside their shared library, past the module objects, so one module from its
source and one compiled could run two versions of the code.
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
)
GROUP = "bridge._native"  # the shared library: bridge/_native__mypyc.<abi>.so
ROOT = Path(__file__).resolve().parent.parent  # holds bridge/
STAMP = ROOT / "bridge" / ".native-build.json"
PURE_ENV = "JMS_BRIDGE_PURE"
PACKAGES = ("bridge", "adapters", "policies")  # every source a build depends on


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


def _extension(module: str, root: Path) -> Path | None:
    base = source(module, root).with_suffix("")
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
    stamp = root / "bridge" / STAMP.name
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
    missing = [m for m in modules if _extension(m, root) is None]
    if missing:
        return f"{missing[0]} has no compiled module"
    return None


class _FromSource(importlib.abc.MetaPathFinder):
    """Imports the named modules from their source files, ahead of any compiled module."""

    def __init__(self, names: Sequence[str], root: Path) -> None:
        self.files = {name: source(name, root) for name in names}

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


_state: dict[str, str | None] = {}


def install() -> None:
    """Decide, once per process, whether ``MODULES`` are imported compiled or from source."""
    if "why_pure" in _state:
        return
    reason = why_pure()
    _state["why_pure"] = reason
    if reason is not None:
        sys.meta_path.insert(0, _FromSource(MODULES, ROOT))


def describe() -> str:
    """One line for the start-up log: compiled, or why not."""
    install()
    reason = _state["why_pure"]
    if reason is None:
        return f"{len(MODULES)} AMQP front-end modules compiled with mypyc"
    return f"pure Python: {reason}"
