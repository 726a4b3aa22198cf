"""Per-record validation at the sink: what a data record must be before it may be staged.

Nothing on a topic is trusted. A record is staged only if it can be applied to the target
exactly: valid UTF-8, not oversized or nested too deep, one JSON object without duplicate
fields, its Kafka key equal to the primary key in its value, every field castable to its target
column without loss (no NaN or infinity in numerics unless the spec allows it, no rounding of
scale, timestamps with an explicit zone and within range), no field the target lacks (unless the
spec says ``unknown_fields: ignore``), and its cursor inside its batch's window. ``check``
returns the reason a record is refused, or None. Pure logic: no database, no Spark, no Airflow.
"""

from __future__ import annotations

import json
import re
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any, Callable

from tidemark.protocol.columns import Column
from tidemark.protocol.screen import Screen, make_screen
from tidemark.protocol.spec import PipelineSpec
from tidemark.protocol.window import Window

MAX_DEPTH = 32  # a row is flat; json columns may nest, but not without limit

_TS = re.compile(r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)(Z|[+-]\d{2}(?::?\d{2})?)?$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")
_INT_RANGE = {"smallint": 15, "integer": 31, "bigint": 63}


class Refused(ValueError):
    """Why one record cannot be staged (the message goes to the DLQ and ``sink_rejects``)."""


_NON_FINITE = ("NaN", "Infinity", "-Infinity")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise Refused(f"field {dup!r} appears twice in one object")
    return obj


def _constant(name: str) -> Any:
    # Python's json reads NaN and Infinity literals; JSON (and PostgreSQL) does not.
    raise Refused(f"value is not JSON: the literal {name} is not a JSON number")


def _decoder() -> json.JSONDecoder:
    # One per RecordRules, built once: per record it cost as much as the parse. Never a module
    # global: its C scanner cannot be pickled, and the rules travel to Spark's executors.
    return json.JSONDecoder(object_pairs_hook=_pairs, parse_float=Decimal, parse_constant=_constant)


def _parse(text: str, decoder: json.JSONDecoder) -> Any:
    try:
        return decoder.decode(text)
    except RecursionError:
        raise Refused(f"value nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise Refused(f"value is not JSON: {exc}") from None


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in node if isinstance(child, (dict, list)))
    return deepest


def _timestamp(text: Any, column: Column, *, zoned: bool) -> datetime:
    if not isinstance(text, str) or not (m := _TS.match(text)):
        raise Refused(f"field {column.name!r}: {_show(text)} is not an ISO-8601 timestamp with at most 6 "
                      f"fractional digits (target {column.describe()})")
    zone = m.group(3)
    if zoned and zone is None:
        raise Refused(f"field {column.name!r}: {text!r} has no time zone (target {column.describe()} needs an "
                      "explicit one, e.g. Z)")
    if not zoned and zone not in (None, "Z", "+00", "+00:00", "+0000", "-00:00"):
        raise Refused(f"field {column.name!r}: {text!r} carries zone {zone}, which target {column.describe()} "
                      "would drop silently")
    try:
        value = datetime.fromisoformat(text.replace(" ", "T", 1))
    except ValueError as exc:
        raise Refused(f"field {column.name!r}: {text!r} is not a valid timestamp ({exc})") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        value.astimezone(timezone.utc)
    except OverflowError:
        raise Refused(f"field {column.name!r}: {text!r} lies outside the years 1..9999") from None
    return value


def _numeric(value: Any, column: Column, allow_non_finite: bool) -> Decimal | float:
    if isinstance(value, str) and value in _NON_FINITE:
        if allow_non_finite:
            return value
        raise Refused(f"field {column.name!r}: {value!r} is not a number a financial column may hold "
                      f"(target {column.describe()}; set allow_non_finite_numbers in the spec to accept it)")
    if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
        raise Refused(f"field {column.name!r}: {_show(value)} is not a JSON number (target {column.describe()}; "
                      "numbers travel as JSON numbers, never as strings)")
    if column.data_type in ("double precision", "real"):
        return value
    number = value if isinstance(value, Decimal) else Decimal(value)
    if column.precision is None:
        return number
    scale = column.scale or 0
    if number.as_tuple().exponent < -scale:  # more places than the column keeps: exact only if they are zeros
        with localcontext() as ctx:
            ctx.prec = max(len(number.as_tuple().digits), column.precision) + 2
            try:
                exact = number.quantize(Decimal(1).scaleb(-scale)) == number
            except InvalidOperation:
                exact = False
        if not exact:
            raise Refused(f"field {column.name!r}: {value} has more than {scale} decimal place(s) and would be "
                          f"rounded by target {column.describe()}")
    if number and number.adjusted() >= column.precision - scale:  # |number| >= 10 ** (precision - scale)
        raise Refused(f"field {column.name!r}: {value} does not fit target {column.describe()} "
                      "(numeric field overflow)")
    return number


def _text(value: Any, column: Column) -> str:
    if not isinstance(value, str):
        raise Refused(f"field {column.name!r}: {_show(value)} is not a JSON string (target {column.describe()})")
    if "\x00" in value:
        raise Refused(f"field {column.name!r}: contains a NUL character, which PostgreSQL text cannot hold")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Refused(f"field {column.name!r}: contains an unpaired UTF-16 surrogate (\\ud800-\\udfff)") from None
    if column.max_length is not None and len(value) > column.max_length:
        raise Refused(f"field {column.name!r}: {len(value)} characters do not fit target {column.describe()}")
    return value


def _checker(column: Column, allow_non_finite: bool) -> Callable[[Any], Any]:
    t = column.data_type
    if t in _INT_RANGE:
        bits = _INT_RANGE[t]

        def integer(v: Any) -> int:
            if isinstance(v, bool) or not isinstance(v, int):
                raise Refused(f"field {column.name!r}: {_show(v)} is not a JSON integer (target {t})")
            if not -(1 << bits) <= v < (1 << bits):
                raise Refused(f"field {column.name!r}: {v} is out of range for target {t}")
            return v
        return integer
    if t in ("numeric", "double precision", "real"):
        return lambda v: _numeric(v, column, allow_non_finite)
    if t in ("text", "character varying", "character"):
        return lambda v: _text(v, column)
    if t == "timestamp with time zone":
        return lambda v: _timestamp(v, column, zoned=True)
    if t == "timestamp without time zone":
        return lambda v: _timestamp(v, column, zoned=False)
    if t == "date":
        def day(v: Any) -> date:
            if not isinstance(v, str) or not _DATE.match(v):
                raise Refused(f"field {column.name!r}: {_show(v)} is not a date yyyy-MM-dd")
            try:
                return date.fromisoformat(v)
            except ValueError as exc:
                raise Refused(f"field {column.name!r}: {v!r} is not a valid date ({exc})") from None
        return day
    if t == "boolean":
        def boolean(v: Any) -> bool:
            if not isinstance(v, bool):
                raise Refused(f"field {column.name!r}: {_show(v)} is not a JSON boolean")
            return v
        return boolean
    if t == "uuid":
        def ident(v: Any) -> str:
            if not isinstance(v, str) or not _UUID.match(v):
                raise Refused(f"field {column.name!r}: {_show(v)} is not a UUID")
            return v.lower().replace("-", "")
        return ident
    if t in ("json", "jsonb"):
        return lambda v: v

    def other(v: Any) -> Any:  # types without a rule here: PostgreSQL casts them in the merge
        if isinstance(v, str):
            return _text(v, column)
        if isinstance(v, (dict, list)):
            raise Refused(f"field {column.name!r}: a JSON {type(v).__name__} cannot be cast to target {t}")
        return v
    return other


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


class RecordRules:
    """The checks for one pipeline's records against its target table's columns."""

    def __init__(self, spec: PipelineSpec, columns: list[Column], *, events: bool = False):
        """``events``: the rules for the spec's stream (keyed by ``stream.key``, timed by
        ``stream.event_time``, no window) instead of its batch records."""
        table = spec.stream.target_table if events and spec.stream else spec.target_table
        if not columns:
            raise LookupError(f"pipeline {spec.name}: target table {table} does not exist")
        # Only plain values of the spec: the rules travel to Spark's executors (``Checker``).
        self.table, self.primary_key, self.unknown_fields = table, list(spec.primary_key), spec.unknown_fields
        self.cursor_column, self.cursor_kind = spec.cursor.column, spec.cursor.kind
        self.columns = {c.name: c for c in columns}
        self.key_names = [spec.stream.key] if events and spec.stream else list(spec.primary_key)
        self.time_column = spec.stream.event_time if events and spec.stream else spec.cursor.column
        missing = [c for c in dict.fromkeys((*spec.primary_key, *self.key_names, self.time_column))
                   if c not in self.columns]
        if missing:
            raise LookupError(f"pipeline {spec.name}: target table {table} has no column(s) {missing}")
        allow = spec.allow_non_finite_numbers
        self.checks = {c.name: _checker(c, allow) for c in columns}
        # A single timestamp key travels as Spark's cast to string: UTC, without a zone.
        self.key_checks = {n: (lambda v, c=self.columns[n]: _timestamp(v, c, zoned=False))
                           if self.columns[n].data_type == "timestamp with time zone" else self.checks[n]
                           for n in self.key_names}
        # One integer or text key column: its key is exactly the value's text (others: parsed and compared).
        self.plain_key = len(self.key_names) == 1 and self.columns[self.key_names[0]].data_type in (
            *_INT_RANGE, "text", "character varying", "character")
        self.required = [c.name for c in columns if c.not_null]
        self.max_bytes = spec.max_record_bytes
        self._decoder = _decoder()

    def screen(self) -> Screen | None:
        """The JVM's screen of events under these rules (made once, as the rules are); None where it
        cannot be made (a key of more than one column or of another type, a required column of a
        type without a pattern)."""
        if "_screen" not in self.__dict__:  # not functools.cached_property: its lock does not pickle
            self._screen = self._made_screen()
        return self._screen

    def _made_screen(self) -> Screen | None:
        if not self.plain_key:
            return None
        required = [*self.required, *self.primary_key, *self.key_names, self.time_column, self.cursor_column]
        return make_screen(self.columns, key=self.key_names[0], required=required, max_bytes=self.max_bytes)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_decoder"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _decoder=_decoder())

    def check(self, key: bytes | None, value: bytes | None, window: Window | None) -> str | None:
        """None if the record may be staged (an event: applied), else why not. ``window`` None: an
        event, whose time must only be present."""
        try:
            self._check(key, value, window)
        except Refused as exc:
            return str(exc)
        return None

    def _check(self, key: bytes | None, value: bytes | None, window: Window | None) -> None:
        if value is None:
            raise Refused("record without a value")
        if len(value) > self.max_bytes:
            raise Refused(f"value of {len(value)} bytes exceeds max_record_bytes {self.max_bytes}")
        text, key_text = _utf8(value, "value"), _utf8(key, "key") if key is not None else None
        row = _parse(text, self._decoder)
        if not isinstance(row, dict):
            raise Refused(f"value is a JSON {type(row).__name__}, not an object")
        if ("{" in text[1:] or "[" in text) and _depth(row) > MAX_DEPTH:
            raise Refused(f"value nested deeper than {MAX_DEPTH} levels")
        typed: dict[str, Any] = {}
        for name, raw in row.items():
            check = self.checks.get(name)
            if check is None:
                if self.unknown_fields == "reject":
                    raise Refused(f"field {name!r} is not a column of target {self.table} "
                                  "(set unknown_fields: ignore in the spec to drop such fields)")
                continue
            if raw is not None:
                typed[name] = check(raw)
        for name in self.required:
            if typed.get(name) is None:
                raise Refused(f"field {name!r} is missing or null, but target column {name} is NOT NULL")
        pk = tuple(typed.get(c) for c in self.primary_key)
        if any(v is None for v in pk):
            raise Refused(f"primary key {self.primary_key} missing or null in the value")
        self._check_key(key_text, tuple(typed.get(c) for c in self.key_names))
        when = typed.get(self.time_column)
        if window is not None:
            self._check_window(when, pk, window)
        elif when is None:
            raise Refused(f"event time field {self.time_column!r} is missing or null")
        elif typed.get(self.cursor_column) is None:  # the serving view and compaction order by it
            raise Refused(f"cursor field {self.cursor_column!r} is missing or null")

    def _check_key(self, key: str | None, expected: tuple[Any, ...]) -> None:
        names = self.key_names
        what = "primary key" if names == self.primary_key else f"key field {names[0]}"
        if any(v is None for v in expected):  # a nullable key field left out or null: no key to match
            raise Refused(f"the value has no {what} ({', '.join(names)} missing or null)")
        if self.plain_key and key == str(expected[0]) and not isinstance(expected[0], bool):
            return  # the usual case, decided without parsing the key
        if key is None:
            raise Refused("record without a key")
        if len(names) == 1:
            parts: dict[str, Any] = {names[0]: _key_literal(key, self.columns[names[0]])}
        else:
            try:
                parts = _parse(key, self._decoder)
            except Refused as exc:
                raise Refused(f"key {key!r} is not the JSON object of {names}: {exc}") from None
            if not isinstance(parts, dict) or sorted(parts) != sorted(names):
                raise Refused(f"key {key!r} is not the JSON object of {names}")
        try:
            from_key = tuple(self.key_checks[n](parts[n]) for n in names)
        except Refused as exc:
            raise Refused(f"key {key!r} does not match the {what} in the value: {exc}") from None
        if from_key != expected:
            raise Refused(f"key {key!r} does not match the {what} in the value "
                          f"{dict(zip(names, map(str, expected)))}")

    def _check_window(self, cursor: Any, pk: tuple[Any, ...], window: Window) -> None:
        if cursor is None:
            raise Refused(f"cursor field {self.cursor_column!r} is missing or null")
        if isinstance(cursor, datetime) != isinstance(window.hi.cursor, datetime):
            raise Refused(f"cursor field {self.cursor_column!r}: {cursor} is not a {self.cursor_kind}")
        lo, hi = window.lo, window.hi
        inside = (cursor < hi.cursor or (cursor == hi.cursor and (hi.pk is None or _order(pk, hi.pk) != 1))) and (
            cursor > lo.cursor or (cursor == lo.cursor and lo.pk is not None and _order(pk, lo.pk) in (1, None)))
        if not inside:
            raise Refused(f"cursor {self.cursor_column}={_plain(cursor)} (key {', '.join(map(str, pk))}) lies "
                          f"outside the batch's window {window}")


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _key_literal(key: str, column: Column) -> Any:
    """A single-column key as text, read as its column's JSON value would be."""
    if column.data_type in _INT_RANGE and re.fullmatch(r"-?\d{1,20}", key):
        return int(key)
    if column.data_type in ("numeric", "double precision", "real"):
        try:
            return Decimal(key) if re.fullmatch(r"-?\d+(\.\d+)?", key) else key
        except InvalidOperation:
            return key
    return key


def _order(pk: tuple[Any, ...], bound: tuple[Any, ...]) -> int | None:
    """-1, 0 or 1 as ``pk`` sorts before, at or after a bound's key, when Python can tell as PostgreSQL
    would (integer keys); None otherwise: text orders by the column's collation, and the extract's
    predicate (PostgreSQL's row comparison) already decided which side such a row is on."""
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (*pk, *bound)):
        return None
    return (pk > tuple(bound)) - (pk < tuple(bound))


def _plain(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def checked_upstream(records) -> bool:
    """Whether every record of an Arrow table was checked where it was read (``Checker``, or Spark's
    own checks of protocol version 2): its ``reason`` column then stands."""
    import pyarrow.compute as pc

    return "checked" in records.column_names and pc.all(records["checked"]).as_py()


class Checker:
    """``RecordRules.check`` over a whole micro-batch in Arrow form, where its records are: on Spark's
    executors (``mapInArrow``), in parallel and beside the Kafka read, instead of in the sink's one
    Python process afterwards. Adds ``reason`` (why a record is refused, or null) and ``checked``
    (whether it was checked here) to each Arrow batch; the sink checks itself whatever is not
    ``checked`` (control messages, records of attempts opened after the checker was made).

    ``windows``: the planned window of each open attempt, by (batch id, attempt). Picklable without
    Tidemark installed where it runs (the modules of ``tidemark.sink.job.EXECUTOR_MODULES`` travel
    by value), like the extract's totals."""

    def __init__(self, topic: str, rules: RecordRules | None, windows: dict[tuple[str, int], Window],
                 event_topic: str | None = None, event_rules: RecordRules | None = None):
        self.topic, self.rules, self.windows = topic, rules, windows
        self.event_topic, self.event_rules = event_topic, event_rules

    @property
    def has_work(self) -> bool:
        """Whether any record can be checked here (none: an Arrow round trip for nothing)."""
        return (self.rules is not None and bool(self.windows)) or self.event_rules is not None

    def __call__(self, batches):
        for batch in batches:
            yield self.check(batch)

    def check(self, batch):
        """The batch with ``reason`` and ``checked``; where it has them already (records Spark checked,
        protocol version 2: ``tidemark.protocol.avro.decode``), those records keep theirs."""
        import pyarrow as pa

        names = batch.schema.names
        done = batch.column(names.index("checked")).to_pylist() if "checked" in names else [False] * batch.num_rows
        reasons: list[str | None] = (batch.column(names.index("reason")).to_pylist() if "reason" in names
                                     else [None] * batch.num_rows)
        checked: list[bool] = []
        columns = (batch.column(c).to_pylist() for c in ("topic", "control", "batch_id", "attempt", "key", "value"))
        for i, (topic, control, batch_id, attempt, key, value) in enumerate(zip(*columns)):
            if done[i]:
                checked.append(True)
            elif topic == self.topic and control is None and self.rules is not None and \
                    (window := self.windows.get((batch_id, attempt))) is not None:
                reasons[i] = self.rules.check(key, value, window)
                checked.append(True)
            elif topic == self.event_topic and self.event_rules is not None:
                reasons[i] = self.event_rules.check(key, value, None)
                checked.append(True)
            else:
                checked.append(False)
        kept = [n for n in names if n not in ("reason", "checked")]
        return pa.RecordBatch.from_arrays(
            [*(batch.column(names.index(n)) for n in kept), pa.array(reasons, pa.string()), pa.array(checked, pa.bool_())],
            names=[*kept, "reason", "checked"])


PAYLOAD_LIMIT = 65_536  # characters of a rejected payload kept in sink_rejects (the DLQ gets it whole)


def payload_text(payload: bytes | str | None, limit: int | None = PAYLOAD_LIMIT) -> str | None:
    """A record's bytes as PostgreSQL text can hold them: invalid UTF-8 escaped, NUL shown, capped
    at ``limit`` characters (None: whole, where the text is the only copy kept)."""
    if payload is None:
        return None
    text = payload.decode("utf-8", "backslashreplace") if isinstance(payload, bytes) else payload
    text = text.replace("\x00", "\\x00")
    return text if limit is None or len(text) <= limit else f"{text[:limit]}... ({len(text)} characters in all)"
