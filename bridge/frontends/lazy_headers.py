"""A delivery's headers as a mapping that reads single values off the wire format and decodes
the whole set only when something iterates over it: the front-ends' views of a MESSAGE or a
Basic.Deliver cost a few substring searches on the hot path."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class LazyHeaders(Mapping[str, str]):
    """Subclasses give ``get`` (a fast read of one value, falling back to ``_decoded()``) and
    ``_decode_all`` (every header, decoded once)."""

    __slots__ = ("_all",)

    def __init__(self) -> None:
        self._all: dict[str, str] | None = None

    def get(self, name: str, default: Any = None) -> Any:
        return self._decoded().get(name, default)

    def _decode_all(self) -> dict[str, str]:
        raise NotImplementedError

    def _decoded(self) -> dict[str, str]:
        if self._all is None:
            self._all = self._decode_all()
        return self._all

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return str(value)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())
