"""Reading one dialect's settings from a YAML mapping, with errors a person can act on.

Setting names are matched ignoring case and the separators ``-``, ``_``, ``.`` and spaces, so
each vendor's own spelling works: WebLogic's ``redelivery-limit`` (JMS module descriptor),
``RedeliveryLimit`` (MBean) and "Redelivery Limit" (console) are one setting. Values may be
YAML scalars or strings of them (``5`` or ``"5"``); anything else is a ConfigError naming the
setting and what it got.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from policies.errors import ConfigError
from policies.redelivery.destinations import parse_destination
from policies.redelivery.model import MoveTo, Undelivered

__all__ = ["NO_DESTINATION", "Settings", "describe_value", "normalize", "render"]

# How an operator says "no dead-letter destination" where a vendor has a default one.
NO_DESTINATION = ("", "none")
_SEPARATORS = re.compile(r"[-_. ]")
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
_NUMBER = re.compile(r"[+-]?([0-9]{1,18}(\.[0-9]*)?|\.[0-9]+)")


def normalize(name: str) -> str:
    """``Redelivery-Limit`` -> ``redeliverylimit``."""
    return _SEPARATORS.sub("", name).lower()


def describe_value(value: object) -> str:
    """How an error names a value of the wrong type."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return repr(value[:64] + ("..." if len(value) > 64 else ""))
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a {type(value).__name__}"


class Settings:
    """One dialect's settings. ``known`` maps each setting's documented spelling to its
    accepted aliases (beyond the spelling differences :func:`normalize` absorbs)."""

    def __init__(
        self, dialect: str, values: Mapping[object, object], known: Mapping[str, tuple[str, ...]]
    ) -> None:
        self.dialect = dialect
        self._values: dict[str, tuple[str, object]] = {}
        owner = {normalize(alias): name for name, aliases in known.items()
                 for alias in (name, *aliases)}
        for key, value in values.items():
            if not isinstance(key, str):
                raise ConfigError(f"a setting name must be text, got {describe_value(key)}")
            if normalize(key) == "dialect":
                continue
            name = owner.get(normalize(key))
            if name is None:
                raise ConfigError(
                    f"unknown {dialect} setting {key!r} (known: {', '.join(known)})"
                )
            if name in self._values:
                raise ConfigError(f"{key!r} and {self._values[name][0]!r} are the same setting")
            self._values[name] = (key, value)

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def integer(self, name: str, default: int, *, minimum: int, maximum: int | None = None) -> int:
        """A whole number in [minimum, maximum]."""
        if name not in self._values:
            return default
        key, value = self._values[name]
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
            number = int(value.strip())
        if number is None:
            raise ConfigError(f"{key}: must be a whole number, got {describe_value(value)}")
        self._check_range(key, number, minimum, maximum)
        return number

    def number(self, name: str, default: float, *, minimum: float, maximum: float) -> float:
        """A decimal number in [minimum, maximum]."""
        if name not in self._values:
            return default
        key, value = self._values[name]
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            number = float(value.strip())
        if number is None or number != number:
            raise ConfigError(f"{key}: must be a number, got {describe_value(value)}")
        self._check_range(key, number, minimum, maximum)
        return number

    def boolean(self, name: str, default: bool) -> bool:
        """``true`` or ``false`` (a YAML boolean or that text)."""
        if name not in self._values:
            return default
        key, value = self._values[name]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(f"{key}: must be true or false, got {describe_value(value)}")

    def text(self, name: str, default: str | None) -> str | None:
        """A string as written (a number is taken as its text)."""
        if name not in self._values:
            return default
        key, value = self._values[name]
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: must be text, got {describe_value(value)}")

    def destination(self, name: str, default: str | None) -> MoveTo | Undelivered | None:
        """A dead-letter destination: a move, the undelivered queue, or None (none: ``""`` or
        ``none``). See :func:`policies.redelivery.destinations.parse_destination`."""
        text = self.text(name, default)
        if text is None or text.strip().lower() in NO_DESTINATION:
            return None
        try:
            destination = parse_destination(text)
        except ConfigError as error:
            raise ConfigError(f"{self.key(name)}: {error}") from None
        return Undelivered() if destination is None else MoveTo("exact", destination)

    def key(self, name: str) -> str:
        """The name as the operator wrote it, for error messages."""
        return self._values[name][0] if name in self._values else name

    @staticmethod
    def _check_range(key: str, number: float, minimum: float, maximum: float | None) -> None:
        shown = int(number) if float(number).is_integer() else number
        if number < minimum:
            raise ConfigError(f"{key}: must be at least {_show(minimum)}, got {shown}")
        if maximum is not None and number > maximum:
            raise ConfigError(f"{key}: must be at most {_show(maximum)}, got {shown}")


def _show(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def render(values: Mapping[object, object]) -> str:
    """A policy mapping as one line, in order: ``dialect: tibco, maxRedelivery: 5``."""
    return ", ".join(f"{key}: {value}" for key, value in values.items())
