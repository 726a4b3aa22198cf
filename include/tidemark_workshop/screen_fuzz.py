"""Events for fuzzing the JVM's screen (``tidemark.protocol.records.RecordRules.screen``): a table of every
type the screen has a pattern for, its rules, events near and past each column's edges as a producer
might write them, and Python's ``re`` standing in for what ``tidemark.sink.job.screened`` computes in
the JVM. Used by the unit test of the screen and by the stack test that runs it in Spark."""

from __future__ import annotations

import json
import random
import re

from tidemark.protocol.columns import Column
from tidemark.protocol.records import RecordRules
from tidemark.protocol.spec import PipelineSpec

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


def screen_rules(key: str = "id", columns=COLUMNS, **extra) -> RecordRules:
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
    if (ordered := re.search(screen.ordered, v)) is not None and ordered.group(1) == k:
        return True
    found = re.search(screen.value, v)
    return (found is not None and found.group(1) == k
            and len(names := re.findall(screen.names, v)) == len(set(names)) and set(screen.required) <= set(names))


def event_fields(rng: random.Random) -> dict:
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


def event_text(rng: random.Random, fields: dict) -> bytes:
    """The event as a producer might write it: any order, any spacing, raw numbers, a field left out
    or said twice now and then."""
    names = list(fields)
    if rng.random() < 0.6:  # else in the table's order, as most producers write
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


def widest(columns=COLUMNS) -> tuple[RecordRules, list[tuple[bytes, bytes]]]:
    """The rules of a table of SCREEN_FIELDS columns (the widest screened; COLUMNS' types over and
    over), and the events that recurse deepest in Java's matcher: every field, in the table's order
    (the ordered path) and reversed (the any-order path), with and without spaces between."""
    from tidemark.protocol.screen import SCREEN_FIELDS

    wide = list(columns)
    kinds = [c for c in columns if not c.not_null]
    while len(wide) < SCREEN_FIELDS:
        k = kinds[len(wide) % len(kinds)]
        wide.append(Column(f"f{len(wide)}", k.data_type, False, k.precision, k.scale, k.max_length))
    rules = screen_rules(columns=wide)
    sample = {"id": "7", "amount": "12345678901234.25", "currency": '"EUR"', "memo": '"' + "m" * 200 + '"',
              "small": "-32", "rate": "1.5", "booked_on": '"2026-11-27"', "settled": "true",
              "ref": '"123e4567-e89b-12d3-a456-426614174000"', "local_at": '"2026-11-27T20:00:00"',
              "updated_at": '"2026-11-27T20:00:00Z"'}  # a good value of each of COLUMNS
    of_type = {c.data_type: sample[c.name] for c in columns}
    fields = [(c.name, of_type[c.data_type]) for c in wide]

    def event(order, ws: str = "") -> tuple[bytes, bytes]:
        return b"7", ("{" + ",".join(f'{ws}"{n}"{ws}:{ws}{v}{ws}' for n, v in order) + "}").encode()

    return rules, [event(fields), event(fields, " \n "), event(fields[::-1]), event(fields[::-1], "  ")]
