"""The AMQP front-end's compiled build (``bridge.compiled``, ``scripts/compile``): taken only
whole and current, and the sources otherwise."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import compiled

MODULES = ("pkg.alpha", "pkg.sub.beta")
PACKAGES = ("pkg",)
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two module sources, a stamp of them and an extension module for each: a current build."""
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)
    for name in (*MODULES, "pkg.gamma"):  # gamma: a module they import, not compiled
        path = compiled.source(name, tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"NAME = {name!r}\n")
    build = compiled.build_dir(tmp_path)
    for name in (*MODULES, compiled.LIBRARY):
        built = build.joinpath(*name.split(".")).with_suffix(SUFFIX)
        built.parent.mkdir(parents=True, exist_ok=True)
        built.write_bytes(b"")
    (build / compiled.STAMP.name).write_text(compiled.stamp_text(MODULES, tmp_path, PACKAGES))
    return tmp_path


def why(tree: Path) -> str | None:
    return compiled.why_pure(MODULES, tree, PACKAGES)


def test_a_current_build_is_taken(tree: Path) -> None:
    assert why(tree) is None


def test_an_edited_source_sends_every_module_to_its_source(tree: Path) -> None:
    source = compiled.source("pkg.sub.beta", tree)
    source.write_text(source.read_text() + "# edited\n")
    assert why(tree) == (
        "pkg/sub/beta.py changed since the build (scripts/compile builds it again)")


def test_a_change_to_any_module_of_the_packages_is_a_change_of_the_build(tree: Path) -> None:
    """mypyc may write a constant of a module the compiled ones import into their C."""
    gamma = compiled.source("pkg.gamma", tree)
    gamma.write_text(gamma.read_text() + "LIMIT = 2\n")
    assert why(tree) == "pkg/gamma.py changed since the build (scripts/compile builds it again)"
    gamma.unlink()
    assert why(tree) == "pkg/gamma.py changed since the build (scripts/compile builds it again)"


def test_no_stamp_a_missing_extension_or_another_python_is_no_build(tree: Path) -> None:
    library = compiled.extension(compiled.LIBRARY, tree)
    assert library is not None
    library.unlink()
    assert why(tree) == f"{compiled.LIBRARY} has no compiled module"
    alpha = compiled.extension("pkg.alpha", tree)
    assert alpha == compiled.build_dir(tree) / "pkg" / f"alpha{SUFFIX}"
    alpha.unlink()
    assert why(tree) == "pkg.alpha has no compiled module"
    stamp = compiled.build_dir(tree) / compiled.STAMP.name
    built = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**built, "python": "2.7.18"}))
    assert why(tree) == "compiled for another Python"
    stamp.write_text("{not json")
    assert "cannot be read" in (why(tree) or "")
    stamp.unlink()
    assert why(tree) == "not compiled (scripts/compile builds them)"


def test_the_environment_can_ask_for_the_sources(tree: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(compiled.PURE_ENV, "0")
    assert why(tree) is None
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    assert why(tree) == "JMS_BRIDGE_PURE is set"


def _imported_from(env: dict[str, str], first: str = "") -> list[str]:
    """Where a new process imports each compiled module from, and what it says of the build
    (``first``: a module it imports before any)."""
    code = ((f"import {first}\n" if first else "") +
            "import importlib, bridge.compiled as c\n"
            "print(c.describe())\n"
            "for m in c.MODULES:\n"
            "    print(importlib.import_module(m).__spec__.origin)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=compiled.ROOT, timeout=60, check=True)
    return done.stdout.splitlines()


def test_with_the_sources_asked_for_every_module_is_its_source_file() -> None:
    lines = _imported_from({**os.environ, compiled.PURE_ENV: "1"})
    assert lines[0] == "pure Python: JMS_BRIDGE_PURE is set"
    assert lines[1:] == [str(compiled.source(m)) for m in compiled.MODULES]


def test_after_setup_the_build_is_current_and_taken() -> None:
    """``scripts/setup`` compiles: under CI (which runs it) the build must be current and every
    module must come from it; elsewhere, where a source may be mid-edit, only when current."""
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    lines = _imported_from(env)
    if lines[0].startswith("pure Python") and not os.environ.get("CI"):
        pytest.skip(f"the build is not current here ({lines[0]})")
    assert lines[0] == f"{len(compiled.MODULES)} modules of the AMQP path compiled with mypyc"
    # (A module another compiled module imported first names a path mypyc made up from its
    # shared library's place; it is in the build all the same.)
    assert all(origin.startswith(f"{compiled.BUILD}/") and origin.endswith(SUFFIX)
               for origin in lines[1:]), lines


@pytest.mark.parametrize("first", ["policies.delay", "adapters.rabbitmq_stomp"])
def test_a_module_imported_before_the_bridge_is_its_source_and_so_are_the_others(
        first: str) -> None:
    """``adapters`` and ``policies`` may not import ``bridge``, so nothing checks the build when
    one of their modules is imported first: that import must find the source (nothing compiled
    lies beside it), and the bridge must then take no module from the build."""
    lines = _imported_from({k: v for k, v in os.environ.items() if k != compiled.PURE_ENV},
                           first)
    assert lines[1:] == [str(compiled.source(m)) for m in compiled.MODULES]
    if compiled.stale() is None:  # else the reason is the stale build (never under CI)
        assert lines[0] == f"pure Python: {first} was imported (from its source) before the bridge"


def test_nothing_compiled_lies_beside_a_source() -> None:
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    beside = [f for package in compiled.PACKAGES for f in (compiled.ROOT / package).rglob("*")
              if f.name.endswith(suffixes)]
    assert beside == []


def test_a_build_of_other_modules_is_not_taken(tree: Path) -> None:
    stamp = compiled.build_dir(tree) / compiled.STAMP.name
    stamp.write_text(compiled.stamp_text(MODULES[:1], tree, PACKAGES))
    assert why(tree) == (
        "the build is of other modules (scripts/compile builds these)")
