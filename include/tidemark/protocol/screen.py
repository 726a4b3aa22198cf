"""The JVM's screen of events (``tidemark.sink.job.screened``): regular expressions made from the
real-time table's columns that Spark matches each event's JSON against before any Python reads it.
An event the screen passes is one ``tidemark.protocol.records.RecordRules.check`` accepts; any other is
checked in Python, as before. Pure logic: no database, no Spark.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidemark.protocol.columns import Column

# Regular expressions, read alike by Java and Python, of JSON values each of which its column's check
# in ``tidemark.protocol.records`` accepts (not every such value: a value they do not match is checked in Python).
# Years 1000-8999 and offsets under 14 hours keep every timestamp inside 1..9999 in UTC; the 29th of
# February is left to Python.
_WS = r"[ \t\n\r]*"
_WS_POSSESSIVE = _WS + "+"  # the same run, never handed back: [ \t\n\r]*+
_DAY = (r"[1-8][0-9]{3}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
        r"|(?:0[13578]|1[02])-31)")
_CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
# A character of a JSON string the screen passes: printable ASCII but quote and backslash (so no
# escape, and anything else, invalid UTF-8 included, which the JVM reads as U+FFFD, is Python's to judge)
_TEXT = r"[ !#-\[\]-~]"
_INT_DIGITS = {"smallint": 3, "integer": 8, "bigint": 17}  # after the first digit
SCREEN_FIELDS = 64  # a wider table is not screened: Java's matcher recurses once per field
_SCREEN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a column name the patterns may hold as it is


def value_pattern(column: Column) -> str | None:
    """The pattern of JSON values of ``column`` that the JVM screen accepts; None: none."""
    t = column.data_type
    if t in _INT_DIGITS:  # at most 4, 9 or 18 digits: inside the type's range; never "-0" (a key's text)
        return rf"(?:0|-?[1-9][0-9]{{0,{_INT_DIGITS[t]}}})"
    if t in ("double precision", "real"):
        return r"-?(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,15})?"
    if t == "numeric" and column.precision is not None and 0 <= (column.scale or 0) < column.precision:
        scale = column.scale or 0
        fraction = rf"(?:\.[0-9]{{1,{scale}}})?" if scale else ""
        return rf"-?(?:0|[1-9][0-9]{{0,{column.precision - scale - 1}}}){fraction}"
    if t in ("text", "character varying", "character"):
        return rf'"{_TEXT}{{0,{column.max_length}}}"' if column.max_length is not None else rf'"{_TEXT}*"'
    if t == "timestamp with time zone":
        return rf'"{_DAY}T{_CLOCK}(?:Z|[+-](?:0[0-9]|1[0-3]):[0-5][0-9])"'
    if t == "timestamp without time zone":
        return rf'"{_DAY}T{_CLOCK}Z?"'
    if t == "date":
        return rf'"{_DAY}"'
    if t == "boolean":
        return "(?:true|false)"
    if t == "uuid":
        return r'"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"'
    return None


@dataclass(frozen=True)
class Screen:
    """What the JVM checks of an event before any Python does (``tidemark.sink.job.screened``): an
    event of at most ``max_bytes`` with a key (not empty) is one ``RecordRules.check`` accepts when its
    value matches ``ordered`` with that key as group 1, or matches ``value`` with that key as group 1
    and its field names (group 1 of each match of ``names``) are distinct and include every one of
    ``required``. Any other is checked in Python. Patterns of printable ASCII only, with no lookaround
    over the whole value (``ordered`` looks at its first character): linear in the value's length."""

    value: str
    names: str
    required: tuple[str, ...]
    max_bytes: int
    # The usual event, its fields in the table's order (each at most once, the required ones there):
    # matched with its key as group 1, it passes without ``value`` or ``names`` (Spark's OR short-circuits;
    # ``screened`` says the names' array once so that no common subexpression makes it for every event).
    ordered: str


def make_screen(columns: Mapping[str, Column], *, key: str, required: Iterable[str],
                max_bytes: int) -> Screen | None:
    """The screen of events of a table of ``columns`` keyed by its one column ``key`` (an integer or
    text column), with every field of ``required`` present and not null; None where it cannot be made
    (a required column of a type without a pattern, more than SCREEN_FIELDS fields)."""
    fields = {n: v for n, c in columns.items() if _SCREEN_NAME.match(n) and (v := value_pattern(c))}
    needed = dict.fromkeys(required)  # in order, once each
    if any(n not in fields for n in needed) or len(fields) > SCREEN_FIELDS:
        return None

    def name(n: str) -> str:  # a field's name where one may begin: after { or , (strings hold no quote)
        return rf'[{{,]{_WS}"{n}"{_WS}:{_WS}'

    def field(n: str, v: str) -> str:  # the key field's text (in quotes, or the number) is group 1
        if n == key:
            v = f'"({v[1:-1]})"' if v.startswith('"') else f"({v})"
        return rf'"{n}"{_WS}:{_WS}(?:{v}{"" if n in needed else "|null"})'  # a required one: not null

    # any order; a field twice, or a required one missing: the names say so, and Python which
    one = "(?:" + "|".join(field(n, v) for n, v in fields.items()) + ")"
    # one field per turn, then a comma before the next one's name or the object's end: the key's
    # group is said once, so it is group 1 wherever the key field stands
    # (at most one turn per known field, a bounded loop: Java recurses per turn of an unbounded one;
    # the end is (?![\s\S]): Java's $ also matches before a final U+0085, U+2028 or U+2029)
    end = r"(?![\s\S])"
    value = rf'^\{{{_WS}(?:{one}{_WS}(?:,{_WS}(?=")|\}}{_WS}{end})){{1,{len(fields)}}}{end}'
    # In the table's order: each field after its separator, the { only where the value begins
    # (^, after the one-character look at it) and a comma anywhere else; an optional one may be absent.
    # Possessive (*+) after a value: a comma or the } must follow it, and a long run of spaces handed
    # back one at a time to every optional field after it cost seconds per megabyte (Java and Python alike).
    ordered = r"^(?=\{)" + "".join(
        rf"(?:(?:^\{{|,){_WS}{field(n, v)}{_WS_POSSESSIVE}){'' if n in needed else '?'}"
        for n, v in fields.items()
    ) + rf"\}}{_WS}{end}"
    return Screen(value, name("([A-Za-z_][A-Za-z0-9_]*)"), tuple(needed), max_bytes, ordered)
