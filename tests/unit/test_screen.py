"""The JVM's screen of events (tidemark.protocol.records.RecordRules.screen): every event it passes is one the
Python checks accept, so passing it is never a silent change of what the sink admits. The patterns
are read alike by Java and Python's ``re``; here Python's ``re`` stands in for Spark's ``rlike`` and
``regexp_extract`` (the stack test of the standing sink runs them in the JVM)."""

from __future__ import annotations

import json
import random
import re

from tidemark.protocol.columns import Column
from tidemark.protocol.screen import SCREEN_FIELDS
from tidemark_workshop.screen_fuzz import COLUMNS, event_fields, event_text, passes, screen_rules


def test_every_event_the_screen_passes_is_one_the_checks_accept():
    rng = random.Random(20261127)
    rules = screen_rules()
    passed = refused_by_python = 0
    for _ in range(20_000):
        fields = event_fields(rng)
        value = event_text(rng, fields)
        key = rng.choice([str(fields["id"]).encode()] * 7 + [b"0" + str(fields["id"]).encode(), b"x", None])
        if rng.random() < 0.02:
            value = value[:-1] + b"\xff}"
        if passes(rules, key, value):
            passed += 1
            assert rules.check(key, value, None) is None, value
        elif rules.check(key, value, None) is not None:
            refused_by_python += 1
    assert passed > 300 and refused_by_python > 5_000, (passed, refused_by_python)  # both sides were reached


def test_an_event_in_the_tables_order_passes_by_the_one_pattern_and_only_as_the_checks_accept():
    """The first pattern Spark tries (``Screen.ordered``): alone it passes only events the checks
    accept, and it is what passes the usual event."""
    rng = random.Random(20261128)
    rules = screen_rules()
    ordered, key_group = rules.screen().ordered, 0
    for _ in range(20_000):
        fields = event_fields(rng)
        value = event_text(rng, fields)
        key = rng.choice([str(fields["id"]).encode()] * 7 + [b"x"])
        found = re.search(ordered, value.decode("utf-8", "replace"))
        if found is not None and found.group(1) == key.decode():
            key_group += 1
            assert rules.check(key, value, None) is None, value
    assert key_group > 150, key_group  # about 1 in 100: every field in range, the order kept
    usual = '{"id":7,"amount":12.50,"currency":"EUR","memo":null,"updated_at":"2026-11-27T20:00:00Z"}'
    assert re.search(ordered, usual).group(1) == "7"
    for bad in (usual.replace("{", ",", 1), usual.replace(',"amount"', '{"amount"'),  # a { past the start
                usual.replace('"id":7,"amount":12.50', '"amount":12.50,"id":7'),  # out of order: the other patterns'
                usual.replace(',"memo":null', ',"memo":null,"memo":null'), usual.replace('"amount":12.50,', ""),
                usual.replace("}", ",}"), usual + "}"):
        assert re.search(ordered, bad) is None, bad


def test_the_usual_event_passes_and_a_text_key_is_its_field_as_written():
    good = b'{"id":7,"amount":12.50,"currency":"EUR","updated_at":"2026-11-27T20:00:00.123456Z"}'
    assert passes(screen_rules(), b"7", good) and screen_rules().check(b"7", good, None) is None
    by_currency = screen_rules(key="currency")
    assert passes(by_currency, b"EUR", good) and not passes(by_currency, b"USD", good)
    spaced = json.dumps(json.loads(good.decode()), indent=1).encode()  # newlines between fields
    assert passes(screen_rules(), b"7", spaced)


def test_what_the_screen_leaves_to_python():
    rules = screen_rules()
    base = '{"id":7,"amount":1.00,"currency":"EUR","updated_at":"2026-11-27T20:00:00Z"%s}'
    for extra in (',"id":8', ',"iban":"DE00"', ',"amount":2.00', ',"memo":"a\\"b"'):
        assert not passes(rules, b"7", (base % extra).encode()), extra
    assert not passes(rules, b"07", (base % "").encode())
    assert not passes(rules, b"7", (base % "").replace("2026-11-27", "2028-02-29").encode())  # Python's to judge
    assert not passes(rules, b"7", b" " + (base % "").encode())
    for tail in ("\n", "\u0085", "\u2028", "\u2029", "\n\u2028"):  # Java's $ would let the last three by
        assert passes(rules, b"7", ((base % "") + tail).encode()) == (tail == "\n"), repr(tail)
    assert not passes(rules, b"7", (base % "").replace('"amount":1.00', '"amount": null').encode())
    assert not passes(rules, b"7", (base % "").replace('"amount":1.00,', "").encode())
    assert passes(rules, b"7", (base % ',"memo": null').encode())
    limited = screen_rules(max_record_bytes=1024)
    assert not passes(limited, b"7", (base % (',"memo":"' + "x" * 1000 + '"')).encode())


def test_no_screen_where_a_required_column_has_no_pattern_or_the_key_is_not_plain_or_the_table_is_wide():
    assert screen_rules(columns=[*COLUMNS, Column("doc", "jsonb", True)]).screen() is None
    assert screen_rules(columns=[*COLUMNS[:-1], Column("updated_at", "timestamp with time zone", True),
                           Column("odd name", "text")]).screen() is not None  # left to Python when present
    assert screen_rules(key="booked_on").screen() is None  # a date key: parsed, not compared as text
    wide = [*COLUMNS, *(Column(f"c{i}", "integer") for i in range(SCREEN_FIELDS - len(COLUMNS)))]
    assert screen_rules(columns=wide).screen() is not None and screen_rules(columns=[*wide, Column("c", "integer")]).screen() is None
