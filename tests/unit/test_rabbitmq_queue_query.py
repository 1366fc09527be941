"""The query ``dlq list`` sends RabbitMQ's management API: a page of names and message counts,
filtered by the candidate expression, every character of it carried through the URL."""

from __future__ import annotations

import urllib.parse

from adapters.rabbitmq_management import PAGE_SIZE, queues_query
from bridge.deadletter import metadata


def test_a_filtered_page() -> None:
    query = queues_query(metadata.CANDIDATE_NAMES, 3)
    assert urllib.parse.parse_qs(query, strict_parsing=True) == {
        "page": ["3"], "page_size": [str(PAGE_SIZE)], "columns": ["name,messages"],
        "name": [metadata.CANDIDATE_NAMES], "use_regex": ["true"]}
    # Nothing in it a server could read as another parameter, a space or a path.
    assert not set(query.split("&")[-2].partition("=")[2]) & set("+&=?#/ |$^()\\[]")


def test_every_queue_without_a_filter() -> None:
    assert urllib.parse.parse_qs(queues_query(None, 1, 20)) == {
        "page": ["1"], "page_size": ["20"], "columns": ["name,messages"]}


def test_rabbitmq_takes_at_most_500_a_page() -> None:
    assert PAGE_SIZE == 500
