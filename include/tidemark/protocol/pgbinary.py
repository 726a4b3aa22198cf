"""PostgreSQL's binary ``COPY`` format, written from Arrow columns with numpy (no Python per value).

The executors stage protocol-version-2 records with it (``tidemark.batch.stage``): PostgreSQL then reads
each value as it stores it instead of parsing text (a decimal, a timestamp), which is several times
cheaper on both sides than CSV. Every value is sent in the column's own binary form, so the server
still checks what it checks in text: a numeric's precision, a timestamp's range, UTF-8 and NUL in
text, a char(n)'s length. What this module cannot write exactly (a smallint out of range, a uuid
not in PostgreSQL's canonical text form) raises ``Unencodable`` naming the column, as the server
would refuse it.

Formats: https://www.postgresql.org/docs/current/sql-copy.html (binary format) and each type's
``*_send`` function. Runs on the executors: it needs numpy and pyarrow, nothing of Spark.
"""

from __future__ import annotations

import re
from typing import Any

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"  # signature, flags, no extension
TRAILER = b"\xff\xff"
_EPOCH_2000_DAYS = 10_957  # PostgreSQL counts dates and timestamps from 2000-01-01
_EPOCH_2000_US = _EPOCH_2000_DAYS * 86_400 * 1_000_000
_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")
_TEXT = re.compile(r"^(text|json|character varying(\(\d+\))?|character(\(\d+\))?)$")
_FIXED = {"smallint": ">i2", "integer": ">i4", "bigint": ">i8", "boolean": "u1", "real": ">f4",
          "double precision": ">f8"}
_RANGE = {"smallint": (-(2 ** 15), 2 ** 15 - 1), "integer": (-(2 ** 31), 2 ** 31 - 1)}
# PostgreSQL's date and timestamp ranges (its MIN_TIMESTAMP and END_DATE, from 2000-01-01): outside
# them a value could wrap onto the server's -infinity or infinity, which it accepts unchecked.
_DATE_DAYS = (-2_451_545, 2_145_031_948)
_MIN_TIMESTAMP_US = -211_813_488_000_000_000


class Unencodable(ValueError):
    """A value the column's binary form cannot carry as PostgreSQL would accept it."""


def copy_binary(cur, table_name: str, arrays: list[Any], sql_types: list[str], columns: list[str]) -> None:
    """COPY Arrow ``arrays`` (one per column, equal length) into ``columns`` (quoted names) of a
    table, each array sent as its column's ``sql_types`` entry (PostgreSQL's ``format_type``)."""
    import io

    body = encode(arrays, sql_types)
    cur.copy_expert(f"COPY {table_name} ({', '.join(columns)}) FROM STDIN WITH (FORMAT binary)",
                    io.BytesIO(body), size=1 << 20)


def encode(arrays: list[Any], sql_types: list[str]) -> bytes:
    """The whole binary COPY stream (header, one tuple per row, trailer) of ``arrays``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(arrays[0]) if arrays else 0
    if n == 0:
        return HEADER + TRAILER
    count = np.frombuffer(np.array([len(arrays)], ">i2").tobytes() * n, np.uint8).reshape(n, 2)
    pieces = [_fixed_piece(count, None, with_length=False)]  # each tuple starts with its field count
    for array, sql_type in zip(arrays, sql_types):
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        pieces.append(_piece(array, sql_type))
    rows = pc.binary_join_element_wise(*pieces, pa.scalar(b"", pa.large_binary()))
    offsets = np.frombuffer(rows.buffers()[1], np.int64)[rows.offset:rows.offset + n + 1]
    data = rows.buffers()[2]
    return HEADER + data[int(offsets[0]):int(offsets[-1])].to_pybytes() + TRAILER


def _piece(array, sql_type: str):
    """One column as a large_binary array: per row, the field's length (-1: NULL) and its bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    name = f"column of type {sql_type}"
    if not _carries(array.type, sql_type):  # the decoder's types only: never convert what it did not hand over
        raise TypeError(f"{name}: no exact binary COPY form here from Arrow type {array.type}")
    valid = None if array.null_count == 0 else np.asarray(pc.is_valid(array))
    if sql_type in _FIXED:
        values = np.asarray(pc.fill_null(array, False if sql_type == "boolean" else 0))
        if sql_type in _RANGE and len(values):
            lo, hi = _RANGE[sql_type]
            bad = (values < lo) | (values > hi)
            if valid is not None:
                bad &= valid
            if bad.any():
                raise Unencodable(f"{name}: value {values[bad][0]} out of range [{lo}, {hi}]")
        return _fixed_piece(_bytes(values.astype(_FIXED[sql_type])), valid)
    if sql_type == "date":
        days = np.asarray(pc.fill_null(array, _EPOCH_2000_DAYS).cast(pa.int32())).astype(np.int64) - _EPOCH_2000_DAYS
        _in_range(days, *_DATE_DAYS, name)
        return _fixed_piece(_bytes(days.astype(">i4")), valid)
    if sql_type == "timestamp with time zone":
        micros = np.asarray(pc.fill_null(array.cast(pa.timestamp("us", tz="UTC")), _EPOCH_2000_US).cast(pa.int64()))
        _in_range(micros, _MIN_TIMESTAMP_US + _EPOCH_2000_US, None, name)  # the upper end cannot wrap
        return _fixed_piece(_bytes((micros - _EPOCH_2000_US).astype(">i8")), valid)
    if (m := _NUMERIC.match(sql_type)) is not None:
        return _fixed_piece(_numeric(array, int(m[1]), int(m[2]), name), valid)
    if sql_type == "uuid":
        return _fixed_piece(_uuid(array, valid, name), valid)
    if sql_type == "jsonb" or _TEXT.match(sql_type):
        text = pc.fill_null(array.cast(pa.large_binary()), b"")
        if sql_type == "jsonb":  # jsonb's binary form: a version byte, then the text
            text = pc.binary_join_element_wise(pa.scalar(b"\x01", pa.large_binary()), text,
                                               pa.scalar(b"", pa.large_binary()))
        if valid is not None:  # a NULL is its length -1 alone, no bytes
            text = pc.if_else(pa.array(valid), text, pa.scalar(b"", pa.large_binary()))
        lengths = np.asarray(pc.binary_length(text)).astype(np.int64)
        if valid is not None:
            lengths[~valid] = -1
        prefix = _fixed_piece(_bytes(lengths.astype(">i4")), None, with_length=False)
        return pc.binary_join_element_wise(prefix, text, pa.scalar(b"", pa.large_binary()))
    raise TypeError(f"no binary COPY form here for {name}")


def _carries(arrow_type, sql_type: str) -> bool:
    """Whether Arrow ``arrow_type`` holds ``sql_type``'s values exactly (as Spark decodes them)."""
    import pyarrow as pa

    t = pa.types
    if sql_type in ("smallint", "integer", "bigint"):
        return t.is_signed_integer(arrow_type)
    if sql_type == "boolean":
        return t.is_boolean(arrow_type)
    if sql_type == "real":
        return t.is_float32(arrow_type)
    if sql_type == "double precision":
        return t.is_float32(arrow_type) or t.is_float64(arrow_type)
    if sql_type == "date":
        return t.is_date32(arrow_type)
    if sql_type == "timestamp with time zone":
        return t.is_timestamp(arrow_type)
    if _NUMERIC.match(sql_type):
        return t.is_decimal128(arrow_type)
    return t.is_string(arrow_type) or t.is_large_string(arrow_type)


def _in_range(values, lo: int, hi: int | None, name: str) -> None:
    """Refuse the first value outside [lo, hi] (NULLs were filled with a value inside)."""
    import numpy as np

    bad = (values < lo) if hi is None else (values < lo) | (values > hi)
    if bad.any():
        raise Unencodable(f"{name}: a value ({values[int(np.argmax(bad))]} days or microseconds) is outside "
                          "PostgreSQL's range for the type")


def _bytes(values):
    """A numpy array of big-endian scalars (or rows of bytes) as an (n, width) uint8 array."""
    import numpy as np

    n = len(values)
    return np.ascontiguousarray(values).view(np.uint8).reshape(n, -1)


def _fixed_piece(data, valid, with_length: bool = True):
    """A large_binary array of fields from fixed-width ``data`` ((n, width) uint8): the length as
    int32, then the bytes; a row not ``valid`` is the length -1 alone (``valid`` None: all are).
    ``with_length`` False: the bytes as they are."""
    import numpy as np
    import pyarrow as pa

    n, width = data.shape
    if not with_length:
        full, keep = data, None
    else:
        length = np.full(n, width, ">i4")
        if valid is not None:
            length[~valid] = -1
        full = np.concatenate([_bytes(length), data], axis=1)
        keep = None
        if valid is not None:
            keep = np.ones(full.shape, bool)
            keep[~valid, 4:] = False
    sizes = np.full(n, full.shape[1], np.int64) if keep is None else keep.sum(axis=1, dtype=np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    flat = full.reshape(-1) if keep is None else full[keep]
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(flat.tobytes())])


def _numeric(array, precision: int, scale: int, name: str):
    """numeric(p,s) in PostgreSQL's binary form at a fixed width: ndigits, weight, sign, dscale and
    base-10000 digits aligned on the decimal point (the server strips leading and trailing zero
    digits). From the decimal128's unscaled 128-bit integers, by long division on 32-bit limbs."""
    import numpy as np
    import pyarrow as pa

    if not pa.types.is_decimal128(array.type) or array.type.scale != scale:
        raise TypeError(f"{name}: expected decimal128 with scale {scale}, got {array.type}")
    n = len(array)
    words = np.frombuffer(array.buffers()[1], np.uint64)[2 * array.offset:2 * (array.offset + n)].reshape(n, 2)
    lo, hi = words[:, 0].copy(), words[:, 1].copy()
    negative = (hi >> np.uint64(63)).astype(bool)
    if array.null_count:
        import pyarrow.compute as pc

        nulls = ~np.asarray(pc.is_valid(array))
        lo[nulls], hi[nulls], negative[nulls] = 0, 0, False
    # |x| of a two's complement 128-bit integer: ~x + 1 (the carry into the high word when lo is 0)
    lo_abs = np.where(negative, ~lo + np.uint64(1), lo)
    hi_abs = np.where(negative, ~hi + (lo == 0).astype(np.uint64), hi)
    mask = np.uint64(0xFFFFFFFF)
    limbs = [hi_abs >> np.uint64(32), hi_abs & mask, lo_abs >> np.uint64(32), lo_abs & mask]

    def divmod_small(d: int):
        remainder = np.zeros(n, np.uint64)
        for i, limb in enumerate(limbs):
            current = (remainder << np.uint64(32)) | limb
            limbs[i] = current // np.uint64(d)
            remainder = current % np.uint64(d)
        return remainder

    integer_groups, fraction_groups = -(-(precision - scale) // 4), -(-scale // 4)
    groups = integer_groups + fraction_groups
    digits = np.zeros((n, groups), np.uint64)
    at = groups - 1
    if scale % 4:  # the last fraction group holds scale % 4 digits, left-aligned
        digits[:, at] = divmod_small(10 ** (scale % 4)) * np.uint64(10 ** (4 - scale % 4))
        at -= 1
    while at >= 0:
        digits[:, at] = divmod_small(10_000)
        at -= 1
    if any(limb.any() for limb in limbs):
        raise Unencodable(f"{name}: a value has more than {4 * groups} digits")
    head = np.empty((n, 4), ">u2")
    head[:, 0] = groups
    head[:, 1] = np.uint16((integer_groups - 1) & 0xFFFF)  # weight: int16, may be -1
    head[:, 2] = np.where(negative, 0x4000, 0)
    head[:, 3] = scale
    return np.concatenate([_bytes(head), _bytes(digits.astype(">u2"))], axis=1)


def _uuid(array, valid, name: str):
    """uuid as its 16 bytes, from the canonical text (8-4-4-4-12 hex digits), the only form the
    extract writes; anything else is refused rather than guessed."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(array)
    text = pc.fill_null(array.cast(pa.string()), "00000000-0000-0000-0000-000000000000")
    lengths = np.asarray(pc.binary_length(text))
    if n and (lengths != 36).any():
        raise Unencodable(f"{name}: {text[int(np.argmax(lengths != 36))].as_py()!r} is not a uuid in canonical form")
    raw = text.cast(pa.large_binary())
    chars = np.frombuffer(raw.buffers()[2], np.uint8)
    start = int(np.frombuffer(raw.buffers()[1], np.int64)[raw.offset])
    chars = chars[start:start + 36 * n].reshape(n, 36)
    hyphens = chars[:, [8, 13, 18, 23]]
    hexes = np.delete(chars, [8, 13, 18, 23], axis=1)
    nibble = np.full(256, 255, np.uint8)
    for i, c in enumerate(b"0123456789abcdef"):
        nibble[c] = i
    for i, c in enumerate(b"ABCDEF"):
        nibble[c] = 10 + i
    values = nibble[hexes]
    bad = (values == 255).any(axis=1) | (hyphens != ord("-")).any(axis=1)
    if bad.any():
        raise Unencodable(f"{name}: {text[int(np.argmax(bad))].as_py()!r} is not a uuid in canonical form")
    return (values[:, 0::2] << 4) | values[:, 1::2]
