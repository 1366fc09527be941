"""Selectors over staged messages (``bridge.staging.selection``), the staged catalogue's
answers to them, and the times ``staged reschedule`` takes (``policies.when``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bridge.staging.catalogue import Catalogue, CatalogueWriter, Entry
from bridge.staging.envelope import MESSAGE_ID, TARGET
from bridge.staging.selection import compile_for, narrowing, picks
from policies.errors import ConfigError
from policies.when import due_at, due_in

NOW = 1_900_000_000_000


def staged(message_id: str, **props: str) -> dict[str, str]:
    return {TARGET: "/queue/orders", MESSAGE_ID: message_id, "jms-bridge-due": "1",
            "correlation-id": message_id, "destination": "/queue/jms-bridge.staging.x", **props}


@pytest.mark.parametrize("broker", ["rabbitmq", "activemq"])
def test_a_selector_reads_the_message_as_sent(broker: str) -> None:
    s = compile_for("orderId = 42 AND region = 'EU' AND JMSDestination = 'Queue[orders]' "
                    "AND JMSMessageID = 'ID:a'", broker)
    assert picks(s, staged("ID:a", orderId="42", region="EU"))
    assert picks(s, staged("ID:a", orderId="042", region="EU"))  # read as a number
    assert not picks(s, staged("ID:a", orderId="42", region="US"))
    assert not picks(s, staged("ID:b", orderId="42", region="EU"))
    assert not picks(s, staged("ID:a", region="EU"))


def test_narrowing_is_what_sqlite_can_check_first() -> None:
    s = compile_for("orderId = 42 AND region = 'EU' AND JMSPriority > 3", "rabbitmq")
    sql, args = narrowing(s) or ("", [])
    assert "CAST" in sql and args == ['$."orderId"', 42, '$."region"', "EU"]
    assert narrowing(compile_for("orderId = 42 OR JMSPriority > 3", "rabbitmq")) is None
    assert narrowing(compile_for("NOT (region = 'EU')", "rabbitmq")) is None
    sql, args = narrowing(compile_for("region IN ('EU', 'US')", "activemq")) or ("", [])
    assert "IN (?, ?)" in sql and args == ['$."region"', "EU", "US"]


def test_the_catalogue_answers_a_selector(tmp_path: Path) -> None:
    path = str(tmp_path / "c.db")
    writer = CatalogueWriter(path).start()
    rows = [Entry(f"ID:{i}", "/queue/orders", NOW + 1000 + i, 3,
                  staged(f"ID:{i}", orderId=str(i % 50), region=("EU", "US")[i % 2]))
            for i in range(200)]
    rows.append(Entry("ID:old", "/queue/orders", NOW + 5000, 3))  # kept no headers
    writer.offer(rows, [])
    deadline = time.monotonic() + 5
    while writer.written < len(rows) and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.close()
    catalogue = Catalogue(path)
    try:
        found = catalogue.entries(now_ms=NOW, selector=compile_for(
            "orderId = 42 AND region = 'EU'", "rabbitmq"))
        assert [e.message_id for e in found] == ["ID:42", "ID:92", "ID:142", "ID:192"]
        found = catalogue.entries(now_ms=NOW, selector=compile_for("orderId >= 48", "activemq"))
        assert len(found) == 8
        assert len(catalogue.entries(now_ms=NOW)) == 201
    finally:
        catalogue.close()


def test_reschedule_times() -> None:
    assert due_in("90s", NOW) == NOW + 90_000
    assert due_in("1h30m", NOW) == NOW + 5_400_000
    assert due_in("1d", NOW) == NOW + 86_400_000
    assert due_at("2030-01-31T09:00:00Z", NOW) == 1_896_080_400_000
    assert due_at("2030-01-31T09:00:00", NOW) == 1_896_080_400_000  # UTC unless it says
    assert due_at("2030-01-31T10:00:00+01:00", NOW) == 1_896_080_400_000
    assert due_at(str(NOW + 5), NOW) == NOW + 5
    for bad in ("soon", "10", "5 m", "-1h", ""):
        with pytest.raises(ConfigError, match="expected a duration"):
            due_in(bad, NOW)
    with pytest.raises(ConfigError, match="ISO 8601"):
        due_at("tomorrow", NOW)
    with pytest.raises(ConfigError, match="ten years"):
        due_in("4000d", NOW)
