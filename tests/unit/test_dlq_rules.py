"""The dead-letter handler's rules table (runmqdlq's format): parsing, validation with line
numbers, first match wins, RETRY(n) exhaustion, FWDQ substitution."""

from __future__ import annotations

import pytest

from policies.dlqrules import Facts, parse_rules
from policies.errors import ConfigError
from policies.selector import RABBITMQ

TABLE = """\
* control data first, then the rules
INPUTQ(jms-bridge.undelivered) WAIT(NO) RETRYINT(2.5)
REASON(MQRC_BACKOUT_*) DESTQ(orders.*) ACTION(RETRY) RETRY(3)
DESTQ(orders.*) ACTION(FWD) FWDQ(parked.$)
REASON(2053) ACTION(FWD) +
   FWDQ('/queue/full.$DESTQ.&REASON')
PERSIST(NO) ACTION(DISCARD)
SELECTOR('region = ''EU'' AND JMSPriority > 4') ACTION(IGNORE)
ACTION(DISCARD)
"""


def facts(reason: str | None = "MQRC_BACKOUT_THRESHOLD_REACHED", code: int | None = 2362,
          dest: str | None = "/queue/orders.eu", persistent: bool = True, retries: int = 0,
          **headers: str) -> Facts:
    return Facts(reason, code, dest, persistent, retries, headers)


def test_control_data_and_first_match_wins() -> None:
    rules = parse_rules(TABLE, source="t.rules")
    c = rules.control
    assert (c.inputq, c.retry_interval_s, c.wait) == ("jms-bridge.undelivered", 2.5, False)
    d = rules.decide(facts())
    assert (d.action, d.destination, d.rule and d.rule.line) == ("RETRY", "/queue/orders.eu", 3)


def test_retry_exhausted_falls_to_the_next_rule() -> None:
    d = parse_rules(TABLE).decide(facts(retries=3))
    assert (d.action, d.destination) == ("FWD", "/queue/parked.orders.eu")


def test_fwdq_substitution_and_reason_codes() -> None:
    d = parse_rules(TABLE).decide(facts("MQRC_Q_FULL", 2053, "/queue/pay"))
    assert (d.action, d.destination) == ("FWD", "/queue/full.pay.MQRC_Q_FULL")
    assert d.rule is not None and d.rule.line == 5  # a continued rule is named by its first line


def test_persistence_selector_and_no_match() -> None:
    rules = parse_rules(TABLE, header_map=RABBITMQ)
    assert rules.decide(facts(None, None, "/queue/x", persistent=False)).action == "DISCARD"
    hit = facts(None, None, "/queue/x", region="EU", priority="7")
    assert rules.decide(hit).action == "IGNORE"
    assert rules.decide(facts(None, None, "/queue/x", region="EU")).action == "DISCARD"
    only = parse_rules("DESTQ(a) ACTION(DISCARD)")
    d = only.decide(facts(dest="/queue/b"))
    assert (d.action, d.rule) == ("IGNORE", None)


def test_wildcards_match_the_name_or_the_destination() -> None:
    rules = parse_rules("DESTQ(/topic/p?ices) ACTION(DISCARD)\nDESTQ(*.eu) ACTION(IGNORE)")
    assert rules.decide(facts(dest="/topic/prices")).action == "DISCARD"
    assert rules.decide(facts(dest="/amq/queue/orders.eu")).rule is not None


@pytest.mark.parametrize(("text", "line", "words"), [
    ("ACTION(FWD)", 1, "FWDQ"),
    ("ACTION(DISCARD)\n\n* c\nACTION(FLY)", 4, "ACTION must be one of"),
    ("DESTQ(a)", 1, "needs ACTION"),
    ("ACTION(DISCARD) FWDQ(x)", 1, "only for ACTION(FWD)"),
    ("ACTION(DISCARD) RETRY(2)", 1, "only for ACTION(RETRY)"),
    ("ACTION(RETRY) RETRY(0)", 1, "RETRY must be"),
    ("ACTION(RETRY) RETRY(x)", 1, "RETRY must be"),
    ("INPUTQ(q) RETRYINT(nan)\nACTION(DISCARD)", 1, "RETRYINT must be"),
    ("INPUTQ(q) RETRYINT(inf)\nACTION(DISCARD)", 1, "RETRYINT must be"),
    ("ACTION(DISCARD) PERSIST(maybe)", 1, "PERSIST must be"),
    ("ACTION(DISCARD)\nSELECTOR('JMSPriority >> 4') ACTION(DISCARD)", 2, "column"),
    ("ACTION(DISCARD) BOGUS(1)", 1, "unknown keyword BOGUS"),
    ("ACTION(DISCARD) junk", 1, "expected KEYWORD(value) at column 17"),
    ("ACTION(DISCARD) ACTION(IGNORE)", 1, "given twice"),
    ("ACTION(DISCARD)\nINPUTQ(q)", 2, "must be the first line"),
    ("INPUTQ(q) RETRYINT(soon)\nACTION(DISCARD)", 1, "RETRYINT"),
    ("INPUTQ(q) WAIT(perhaps)\nACTION(DISCARD)", 1, "WAIT"),
    ("REASON() ACTION(DISCARD)", 1, "empty"),
])
def test_every_error_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_rules(text, source="h.rules")
    message = str(caught.value)
    assert message.startswith(f"h.rules line {line}: ") and words in message
    assert "\n" not in message


def test_an_empty_table_is_an_error() -> None:
    with pytest.raises(ConfigError, match="no rules"):
        parse_rules("* nothing\n\n", source="e.rules")


def test_comments_whole_lines_and_after_a_rule() -> None:
    # `*` starts a comment line, as in runmqdlq's tables; `#` a comment line or the rest of a
    # line after a rule, outside quotes (a '#' inside a quoted selector is the selector's).
    text = """\
* IBM's comment line
  # ours, indented
INPUTQ(jms-bridge.undelivered) WAIT(NO)        # control data: first line, optional
DESTQ(orders.*) ACTION(RETRY) RETRY(3)# no blank before it
REASON(2053) ACTION(FWD) + # a continued rule, its comment before the next line
   FWDQ(full.$)   # and after it
SELECTOR('note = ''a # b''') ACTION(IGNORE) # a quoted # is not a comment
ACTION(DISCARD)
"""
    rules = parse_rules(text, source="c.rules", header_map=RABBITMQ)
    assert rules.control.inputq == "jms-bridge.undelivered" and not rules.control.wait
    assert [r.line for r in rules.rules] == [4, 5, 7, 8]
    assert rules.rules[0].retry == 3
    assert rules.rules[1].fwdq == "full.$"
    assert rules.decide(facts(None, None, "/queue/x", note="a # b")).action == "IGNORE"
    assert rules.decide(facts(None, None, "/queue/x", note="a")).action == "DISCARD"
    assert "#" not in rules.rules[0].text


def test_a_hash_inside_an_unquoted_value_is_kept() -> None:
    d = parse_rules("ACTION(FWD) FWDQ(/queue/a#b)").decide(facts())
    assert d.destination == "/queue/a#b"
