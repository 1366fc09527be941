"""Differential test: every selector of tests/data/selectors.txt compiled to Spark SQL gives the
Python compiler's three-valued answer on the same headers, with ActiveMQ's header map; with
RabbitMQ's, every selector that map answers by rules of its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from policies.errors import InvalidSelector
from policies.selector import ACTIVEMQ, RABBITMQ, compile_selector, parse
from policies.selector.nodes import Identifier, Node, children
from tests.integration.test_selector_activemq import message_headers

CORPUS = Path(__file__).parents[1] / "data" / "selectors.txt"
# Spark compiles each query to Java: the corpus's 333 columns took two minutes so, against
# fifteen seconds interpreted (the same expressions, evaluated without generated code).
INTERPRETED = {"spark.sql.codegen.wholeStage": "false",
               "spark.sql.codegen.factoryMode": "NO_CODEGEN"}

EXTRA_HEADERS = [
    {},
    {"size": "-0.0", "price": "0", "n": "0"},
    {"size": "0.0", "price": "-0", "flag": "TrUe", "n": "-0.0"},
    {"size": "99999999999999999999", "price": "1e400", "name": "a\nc", "color": "red\n"},
    {"size": "0007", "price": "\t3.5 ", "name": "\U0001F600", "color": "\uffff"},
    {"size": "+2147483648", "price": "-Infinity", "destination": "/queue/x",
     "jms-bridge-target": "/topic/t", "priority": "x", "timestamp": "12.5"},
    {"size": "7", "priority": "9", "persistent": "TRUE", "redelivered": "true",
     "JMSXDeliveryCount": "3", "original-destination": "odd", "amqp-message-id": "ID:1"},
]


def corpus() -> list[str]:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def headers() -> list[dict[str, str]]:
    return [message_headers(n) for n in range(40)] + EXTRA_HEADERS


def identifiers(selector: str) -> set[str]:
    names: set[str] = set()
    todo: list[Node] = [parse(selector)]
    while todo:
        node = todo.pop()
        if isinstance(node, Identifier):
            names.add(node.name)
        todo.extend(children(node))
    return names


def mapped(selector: str) -> bool:
    """Whether the selector names an identifier either broker's header map answers by a rule of
    its own (a JMS field, or a header that is not a property): the others compile alike."""
    own = {name for m in (ACTIVEMQ, RABBITMQ) for name in (*m.fields, *m.not_properties)}
    return bool(identifiers(selector) & own)


# The whole corpus with ActiveMQ's map; with RabbitMQ's, the selectors its map answers otherwise
# (building the corpus's columns takes Spark most of the time: a minute and a half beside the
# suite for each map).
@pytest.mark.parametrize("header_map", [ACTIVEMQ, RABBITMQ], ids=["activemq", "rabbitmq"])
def test_spark_answers_as_the_python_compiler(spark: Any, header_map: Any) -> None:
    from pyspark.sql.types import IntegerType, MapType, StringType, StructField, StructType

    from bridge.pipeline.spark_selectors import to_column

    messages = headers()
    df = spark.createDataFrame(
        [(i, h) for i, h in enumerate(messages)],
        StructType([StructField("i", IntegerType()),
                    StructField("headers", MapType(StringType(), StringType()))]),
    ).cache()
    selectors = corpus() if header_map is ACTIVEMQ else [s for s in corpus() if mapped(s)]
    before = {key: spark.conf.get(key, None) for key in INTERPRETED}
    for key, value in INTERPRETED.items():
        spark.conf.set(key, value)
    try:
        rows = df.select("i", *(to_column(s, "headers", header_map).alias(f"s{k}")
                                for k, s in enumerate(selectors))).collect()
    finally:
        for key, value in before.items():
            spark.conf.unset(key) if value is None else spark.conf.set(key, value)
    assert len(rows) == len(messages)
    differences = []
    for k, selector in enumerate(selectors):
        python = compile_selector(selector, header_map)
        for row in rows:
            want, got = python.evaluate(messages[row["i"]]), row[f"s{k}"]
            if want is not got:
                differences.append((selector, messages[row["i"]], want, got))
    assert not differences, f"{len(differences)} differ, first ones: {differences[:5]}"


def test_matches_is_the_filter_and_bad_selectors_are_refused(spark: Any) -> None:
    from bridge.pipeline.spark_selectors import matches, to_column

    df = spark.createDataFrame([({"color": "red"},), ({"color": "blue"},), ({},)], ["headers"])
    # with generated code, as a replay runs it
    assert [r[0] for r in df.select(to_column("color = 'red' OR 1 / 0 > 1e308")).collect()] == [
        True, True, True]
    likes = df.select(to_column("color LIKE 'r%'")).collect()
    assert [r[0] for r in likes] == [True, False, None]
    assert df.where(matches("color = 'red'")).count() == 1
    assert df.where(matches("NOT (color = 'red')")).count() == 1  # unknown is not selected
    with pytest.raises(InvalidSelector):
        matches("color = ")
    assert parse("a = 1")  # the same tree as the Python compiler's
