"""Redelivery policies and dead letters: one canonical model, dialect parsers, the config table.

Pure: stdlib only, no I/O, no clock, no randomness of its own. The bridge calls::

    table = compile_table(config["redelivery"], source="config file /etc/jms-bridge.yaml")
    pattern, policy = table.lookup("/queue/orders.eu", user="alice")
    action = decide(policy, failures, "/queue/orders.eu", headers, random.random())

``failures`` is the ``JMSXDeliveryCount`` of the delivery that failed (the first NACK is
failure 1); ``action`` is one of :class:`Redeliver`, :class:`Move`, :class:`Delete`,
:class:`Undelivered`. :func:`describe` lists what a policy does failure by failure.
"""

from policies.redelivery.describe import Row, describe
from policies.redelivery.dialects import DIALECTS, parse_policy
from policies.redelivery.jmsjca import DEFAULT_POLICY, DEFAULT_TEXT, parse_jmsjca
from policies.redelivery.model import (
    PRESERVE_UNDELIVERED_HEADER,
    Delete,
    Move,
    Policy,
    Redeliver,
    RedeliveryAction,
    Undelivered,
    decide,
)
from policies.redelivery.table import PolicyTable, compile_table

__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_TEXT",
    "DIALECTS",
    "PRESERVE_UNDELIVERED_HEADER",
    "RedeliveryAction",
    "Delete",
    "Move",
    "Policy",
    "PolicyTable",
    "Redeliver",
    "Row",
    "Undelivered",
    "compile_table",
    "decide",
    "describe",
    "parse_jmsjca",
    "parse_policy",
]
