"""The Python code a job's executors import, as one zip the job ships to a cluster itself
(``SparkContext.addPyFile``): the project's packages and the pure-Python distributions that
replay's partitions import (the adapters' broker clients, pamqp, tenacity, structlog), each with
its ``.dist-info``, so that a version asked of ``importlib.metadata`` is answered there too.

The zip is built once and kept under ``$XDG_CACHE_HOME/jms-bridge`` (``~/.cache/jms-bridge``),
named for a digest of the packages' files and the distributions' versions: a changed source or
an upgraded client makes a new one.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

PACKAGES = ("bridge", "adapters", "policies")
# What ``replay.publish_partition`` imports beyond the standard library and PySpark (a unit
# test imports it from the zip alone in an interpreter without site-packages).
DISTRIBUTIONS = ("pika", "pamqp", "stomp.py", "websocket-client", "tenacity", "structlog")


def _package_files() -> Iterator[tuple[str, Path]]:
    """(name in the zip, file) of the project's packages, without bytecode caches."""
    for name in PACKAGES:
        root = Path(__import__(name).__file__ or "").parent
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield f"{name}/{path.relative_to(root).as_posix()}", path


def _distribution_files(name: str) -> Iterator[tuple[str, Path]]:
    """(name in the zip, file) of an installed distribution's modules and metadata."""
    dist = metadata.distribution(name)
    for entry in dist.files or ():
        if entry.parts[0] == ".." or "__pycache__" in entry.parts or entry.suffix == ".pyc":
            continue  # scripts in bin/, bytecode: not importable code
        path = Path(str(dist.locate_file(entry)))
        if path.is_file():
            yield entry.as_posix(), path


def digest() -> str:
    """Of the packages' files and the distributions' versions."""
    h = hashlib.sha256()
    for arcname, path in _package_files():
        h.update(arcname.encode() + b"\0" + path.read_bytes() + b"\0")
    for name in DISTRIBUTIONS:
        h.update(f"{name}=={metadata.version(name)}\0".encode())
    return h.hexdigest()[:20]


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jms-bridge"


def executor_zip(folder: Path | None = None) -> Path:
    """The zip for the current sources and installed distributions: the cached one, or built
    now (written beside its final name and renamed, so a concurrent job never reads half)."""
    folder = folder or cache_folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable home (a service account): the system's temporary folder
        folder = Path(tempfile.gettempdir()) / "jms-bridge"
        folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"executors-{digest()}.zip"
    if target.exists():
        return target
    fd, tmp = tempfile.mkstemp(prefix=".executors-", suffix=".zip", dir=folder)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as z:
            for name in DISTRIBUTIONS:
                for arcname, path in _distribution_files(name):
                    z.write(path, arcname)
            for arcname, path in _package_files():
                z.write(path, arcname)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
