"""The default replay ledger is the archive's and the target's, never the selector's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.pipeline.replay import ledger_name


def test_the_default_ledger_is_one_per_archive_and_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "archive"
    same = ledger_name([str(archive)], None)
    monkeypatch.chdir(tmp_path)
    assert ledger_name(["archive"], None) == same  # the same folder, however it is written
    assert ledger_name([str(archive)], "/queue/elsewhere") != same
    assert ledger_name([str(archive), "s3a://b/more"], None) == \
        ledger_name(["s3a://b/more", str(archive)], None)
    assert ledger_name([str(tmp_path / "other")], None) != same
