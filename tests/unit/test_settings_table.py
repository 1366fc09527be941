"""The settings table of docs/configuration.md against the settings' one declaration (the
fields of ``Settings``): every setting has a row, and every row names real settings, as flags
only where they are flags."""

from __future__ import annotations

import re
from pathlib import Path

from bridge.app.config import ENV_PREFIX, SETTINGS

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
NOT_SETTINGS = {"config"}  # --config names the file, JMS_BRIDGE_CONFIG too


def _first_cells(text: str) -> list[str]:
    """The first cells of the table that starts at the ``| flag | meaning | default |`` row."""
    lines = text.splitlines()
    start = lines.index("| flag | meaning | default |")
    cells = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells.append(re.split(r"(?<!\\)\|", line)[1])
    return cells


def named(cell: str) -> tuple[set[str], set[str]]:
    """The settings a first cell names as flags (``--name``), and as YAML keys (`` `name:` ``,
    a bare `` `name` ``) or environment variables (``JMS_BRIDGE_NAME``)."""
    flags = set(re.findall(r"`--([a-z][a-z-]*)", cell))
    others = set(re.findall(r"`([a-z][a-z-]*):?`", cell))
    others |= {v.lower().replace("_", "-")
               for v in re.findall(rf"`{ENV_PREFIX}([A-Z_]+)`", cell)}
    return flags, others


def check(text: str) -> list[str]:
    problems = []
    documented: set[str] = set()
    for cell in _first_cells(text):
        flags, others = named(cell)
        if not flags and not others:
            problems.append(f"a row names no setting: {cell.strip()}")
        for name in flags:
            f = SETTINGS.get(name)
            if f is None and name not in NOT_SETTINGS:
                problems.append(f"--{name}: no such setting")
            elif f is not None and not f.metadata["flag"]:
                problems.append(f"--{name}: a setting without a flag")
        for name in re.findall(r"`([a-z][a-z-]*):`", cell):  # a YAML key, said as one
            if name not in SETTINGS:
                problems.append(f"{name}: no such setting")
        documented |= flags | others
    problems += [f"{name}: no row" for name in SETTINGS if name not in documented]
    return problems


def test_every_setting_has_a_row_and_every_row_a_setting() -> None:
    assert check(DOC.read_text(encoding="utf-8")) == []


def test_check_sees_a_missing_row_a_made_up_flag_and_a_flag_that_is_none() -> None:
    text = DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `--journal DIR`"))
    text = text.replace(row + "\n", "")
    text = text.replace("| `--config FILE` |", "| `--config FILE`, `--made-up X` |")
    text = text.replace("| `broker-user`,", "| `--broker-user`,")
    text = text.replace("| `redelivery:`", "| `redelivery:`, `made-up-key:`")
    assert sorted(check(text)) == ["--broker-user: a setting without a flag",
                                   "--made-up: no such setting", "journal: no row",
                                   "made-up-key: no such setting"]
