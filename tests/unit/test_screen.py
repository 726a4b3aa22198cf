"""The JVM's screen of events (tidemark.records.RecordRules.screen): every event it passes is one the
Python checks accept, so passing it is never a silent change of what the sink admits. The patterns
are read alike by Java and Python's ``re``; here Python's ``re`` stands in for Spark's ``rlike`` and
``regexp_extract`` (the stack test of the standing sink runs them in the JVM)."""

from __future__ import annotations

import json
import random
import re

from tidemark.records import SCREEN_FIELDS, Column, RecordRules
from tidemark.spec import PipelineSpec

COLUMNS = [
    Column("id", "bigint", True),
    Column("amount", "numeric", True, 18, 2),
    Column("currency", "character", True, max_length=3),
    Column("memo", "text"),
    Column("small", "smallint"),
    Column("rate", "double precision"),
    Column("booked_on", "date"),
    Column("settled", "boolean"),
    Column("ref", "uuid"),
    Column("local_at", "timestamp without time zone"),
    Column("updated_at", "timestamp with time zone", True),
]


def _rules(key: str = "id", columns=COLUMNS, **extra) -> RecordRules:
    spec = PipelineSpec(name="payments", table="core.payments", primary_key=["id"], safe_lag="PT0S",
                        cursor={"kind": "timestamp", "column": "updated_at"}, target_table="dw.payments",
                        sink={"mode": "standing"}, stream={"topic": "t", "key": key, "event_time": "updated_at",
                                                           "target_table": "rt.payments", "serving_view": "v.payments"},
                        **extra)
    return RecordRules(spec, columns, events=True)


def passes(rules: RecordRules, key: bytes | None, value: bytes | None) -> bool:
    """What ``tidemark.sink.job.screened`` computes in the JVM."""
    screen = rules.screen()
    if key is None or value is None or len(value) > screen.max_bytes or not key:
        return False
    k, v = key.decode("utf-8", "replace"), value.decode("utf-8", "replace")  # as the JVM reads them
    found = re.search(screen.value, v)
    return (found is not None and found.group(1) == k
            and len(names := re.findall(screen.names, v)) == len(set(names)) and set(screen.required) <= set(names))


def _value(rng: random.Random) -> dict:
    """An event whose fields are each usually good and now and then at or past the edge of its
    column's rules."""
    def pick(good: list, edge: list):
        return rng.choice(good if rng.random() < 0.85 else edge)

    def digits(n: int) -> str:
        return str(rng.randint(1, 10 ** n - 1))

    def day(good: bool = True) -> str:
        if good:
            return f"{rng.randint(1000, 8999)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        return f"{rng.choice(['0999', '1000', '8999', '9999'])}-{rng.randint(0, 13):02d}-{rng.randint(0, 32):02d}"

    clock = pick([f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}" + rng.choice(
        ["", ".5", ".123456"])], ["24:00:00", "23:60:00", "12:00", "12:00:00.1234567"])
    return {
        "id": int(pick([digits(rng.randint(1, 18)), "0"], ["-1", "9223372036854775807", "-" + digits(19)])),
        "amount": pick([digits(rng.randint(1, 16)) + "." + digits(2), "0.10", "-0.01"], ["1.234", "1e3", "00.5",
                                                                                         digits(17)]),
        "currency": pick(["EUR", "E\u00e9R", "EU"], ["EURO", "E\\u0000R", "E\"R", "\U0001f600\U0001f600"]),
        "memo": pick(["", "a,\"id\":1", "x" * 50, None], ["tab\there", "\ud800"]),
        "small": pick([0, 9999, -32768], [32767, 32768, True]),
        "rate": pick(["1.5", "0", "-0.25"], ["1e-3", "NaN"]),
        "booked_on": pick([day()], [day(False)]),
        "settled": pick([True, False, None], [0]),
        "ref": pick(["123e4567-e89b-12d3-a456-426614174000"], ["123E4567E89B12D3A456426614174000", "nope"]),
        "local_at": f"{pick([day()], [day(False)])}T{clock}{pick(['', 'Z'], ['+02:00'])}",
        "updated_at": pick([day()], [day(False)]) + pick(["T"], [" "]) + clock + pick(["Z", "+01:00", "-13:59"],
                                                                                   ["", "+14:00", "+0100"]),
    }


def _text(rng: random.Random, fields: dict) -> bytes:
    """The event as a producer might write it: any order, any spacing, raw numbers, a field left out
    or said twice now and then."""
    names = list(fields)
    rng.shuffle(names)
    if rng.random() < 0.1:
        names.remove(rng.choice(names))
    if rng.random() < 0.05:
        names.append(rng.choice(names))
    sep = rng.choice([",", ", ", " ,\n "])
    colon = rng.choice([":", ": ", " : "])

    def raw(name: str, v) -> str:
        if name in ("amount", "rate") and isinstance(v, str) and rng.random() < 0.9:
            return v  # a JSON number as written
        if name == "currency" and "\\u" in str(v):
            return f'"{v}"'
        return json.dumps(v, ensure_ascii=rng.random() < 0.2 or v == "\ud800")  # a lone surrogate: escaped

    return ("{" + sep.join(f'"{n}"{colon}{raw(n, fields[n])}' for n in names) + "}").encode()


def test_every_event_the_screen_passes_is_one_the_checks_accept():
    rng = random.Random(20261127)
    rules = _rules()
    passed = refused_by_python = 0
    for _ in range(20_000):
        fields = _value(rng)
        value = _text(rng, fields)
        key = rng.choice([str(fields["id"]).encode()] * 7 + [b"0" + str(fields["id"]).encode(), b"x", None])
        if rng.random() < 0.02:
            value = value[:-1] + b"\xff}"
        if passes(rules, key, value):
            passed += 1
            assert rules.check(key, value, None) is None, value
        elif rules.check(key, value, None) is not None:
            refused_by_python += 1
    assert passed > 300 and refused_by_python > 5_000, (passed, refused_by_python)  # both sides were reached


def test_the_usual_event_passes_and_a_text_key_is_its_field_as_written():
    good = b'{"id":7,"amount":12.50,"currency":"EUR","updated_at":"2026-11-27T20:00:00.123456Z"}'
    assert passes(_rules(), b"7", good) and _rules().check(b"7", good, None) is None
    by_currency = _rules(key="currency")
    assert passes(by_currency, b"EUR", good) and not passes(by_currency, b"USD", good)
    spaced = json.dumps(json.loads(good.decode()), indent=1).encode()  # newlines between fields
    assert passes(_rules(), b"7", spaced)


def test_what_the_screen_leaves_to_python():
    rules = _rules()
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
    limited = _rules(max_record_bytes=1024)
    assert not passes(limited, b"7", (base % (',"memo":"' + "x" * 1000 + '"')).encode())


def test_no_screen_where_a_required_column_has_no_pattern_or_the_key_is_not_plain_or_the_table_is_wide():
    assert _rules(columns=[*COLUMNS, Column("doc", "jsonb", True)]).screen() is None
    assert _rules(columns=[*COLUMNS[:-1], Column("updated_at", "timestamp with time zone", True),
                           Column("odd name", "text")]).screen() is not None  # left to Python when present
    assert _rules(key="booked_on").screen() is None  # a date key: parsed, not compared as text
    wide = [*COLUMNS, *(Column(f"c{i}", "integer") for i in range(SCREEN_FIELDS - len(COLUMNS)))]
    assert _rules(columns=wide).screen() is not None and _rules(columns=[*wide, Column("c", "integer")]).screen() is None
