"""adapters.speedups: installed only when asked, checked against the library's version."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import stomp.transport
from pika.adapters.utils import io_services_utils

from adapters import speedups

TRANSPORT = io_services_utils._AsyncTransportBase


def test_importing_the_adapters_leaves_pika_and_stomp_py_untouched() -> None:
    # A fresh interpreter: this test process may have installed them in another test.
    code = """
import pika.adapters.utils.io_services_utils as io, stomp.transport, stomp.utils
produce, parse = io._AsyncTransportBase._produce, stomp.transport.parse_frame
import adapters.rabbitmq, adapters.activemq, adapters.speedups, bridge.app.serve
assert io._AsyncTransportBase._produce is produce, "pika patched by an import"
assert stomp.transport.parse_frame is parse is stomp.utils.parse_frame, "stomp.py patched"
print("untouched")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "untouched"


def test_install_replaces_both_and_uninstall_puts_them_back() -> None:
    produce, parse = TRANSPORT._produce, stomp.transport.parse_frame
    try:
        assert speedups.install() == ["pika-writes", "stomp-parse"]
        assert TRANSPORT._produce is speedups._produce
        assert stomp.transport.parse_frame is speedups.parse_frame
        assert speedups.install() == ["pika-writes", "stomp-parse"]  # idempotent
    finally:
        speedups.uninstall()
    assert TRANSPORT._produce is produce and stomp.transport.parse_frame is parse
    assert speedups.installed() == []


def test_a_library_version_not_checked_stands_down_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(speedups.CHECKED, "pika", ((0, 13),))
    produce = TRANSPORT._produce
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert speedups.install() == ["stomp-parse"]
        assert TRANSPORT._produce is produce
        (warning,) = caught
        assert "pika-writes not installed" in str(warning.message)
    finally:
        speedups.uninstall()
