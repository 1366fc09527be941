"""Who may call the admin API: bearer tokens read from a file, re-read when the file changes.

The file holds one token per non-empty line (two lines while a rotation overlaps). It is read
when the bridge starts, where a missing, empty or unreadable file is a ConfigError, and again
whenever its modification time, size or inode changes, which is what a Kubernetes Secret
rotation does to a mounted file. A file that cannot be read or holds no token after a change
authenticates nobody until it is fixed: the admin API fails closed.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from policies.errors import ConfigError

# What identifies one version of the file without reading it.
_Stamp = tuple[int, int, int]


def _stamp(path: str) -> _Stamp:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _unreadable(path: str, exc: OSError) -> str:
    return f"admin-token-file {path}: cannot read it: {exc.strerror or exc}"


def read_tokens(path: str) -> tuple[bytes, ...]:
    """The tokens in ``path``; ConfigError naming the problem when there are none."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(_unreadable(path, exc)) from None
    except UnicodeDecodeError:
        raise ConfigError(f"admin-token-file {path}: not UTF-8 text") from None
    tokens = tuple(line.strip().encode() for line in text.splitlines() if line.strip())
    if not tokens:
        raise ConfigError(f"admin-token-file {path}: holds no token (one per line)")
    return tokens


class TokenFile:
    """The tokens of one file, kept current by a stat() on each check."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: _Stamp | None = None
        self._tokens: tuple[bytes, ...] = ()
        self.problem: str | None = None  # why no token is in force, after a bad change
        self.reloads = 0  # times the file was re-read after a change
        try:
            stamp = _stamp(path)
        except OSError as exc:
            raise ConfigError(_unreadable(path, exc)) from None
        self._tokens = read_tokens(path)
        self._stamp = stamp

    def refresh(self) -> None:
        """Re-read the file if it changed since it was last read."""
        try:
            stamp: _Stamp | None = _stamp(self.path)
        except OSError as exc:
            stamp = None
            problem = _unreadable(self.path, exc)
        else:
            if stamp == self._stamp:
                return
            try:
                self._tokens, self._stamp, self.problem = read_tokens(self.path), stamp, None
                self.reloads += 1
                return
            except ConfigError as exc:
                problem = str(exc)
        self._tokens, self._stamp, self.problem = (), stamp, problem

    def accepts(self, presented: str) -> bool:
        """Whether ``presented`` is one of the tokens, compared in constant time (every token
        is compared, so the time says nothing about which one nearly matched)."""
        given = presented.encode()
        ok = False
        for token in self._tokens:
            ok |= hmac.compare_digest(given, token)
        return ok
