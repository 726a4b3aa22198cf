"""Debezium's change records carry their whole schema: Kafka Connect JSON, ``{"schema":S,"payload":P}``,
where S is about 4 KB of a 4.6 KB record and the same bytes for every change of one version of the
table. ``Schemas.read`` parses S once per version and P alone for each record: the same reading as
parsing the whole record (both halves must be whole JSON objects, so the cut is the record's own),
at a fraction of the cost. A record of any other form is read whole, as before.
"""

from __future__ import annotations

import json
from typing import Any

PREFIX, SEPARATOR, SUFFIX = b'{"schema":', b',"payload":', b"}"


class Schemas:
    """The schemas seen in change records, by their exact bytes, parsed once each."""

    def __init__(self, most: int = 64) -> None:
        self.most = most  # records of many schemas are a producer's doing, not Debezium's: memory stays bounded
        self._parsed: dict[bytes, dict[str, Any]] = {}

    def read(self, value: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """``(payload, schema)`` of a record of Kafka Connect's form, both parsed; None for any other
        record (read whole then, as before: its errors are named there)."""
        if not isinstance(value, bytes) or not value.startswith(PREFIX) or not value.endswith(SUFFIX):
            return None
        at = value.find(SEPARATOR, len(PREFIX))
        if at < 0:
            return None
        text = value[len(PREFIX):at]
        schema = self._parsed.get(text)
        try:  # UTF-8, as the whole record is read (json.loads would guess each half's encoding: a BOM, UTF-16)
            payload = json.loads(value[at + len(SEPARATOR):-len(SUFFIX)].decode("utf-8"))
            if schema is None:
                schema = json.loads(text.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):  # not two whole JSON values: not the record's own cut
            return None
        if not isinstance(schema, dict) or not isinstance(payload, dict):
            return None
        if text not in self._parsed:
            if len(self._parsed) >= self.most:
                self._parsed.clear()
            self._parsed[text] = schema
        return payload, schema
