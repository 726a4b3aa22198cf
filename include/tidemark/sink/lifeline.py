"""A standing sink's life line: heartbeat, lease, progress and graceful stop (no Spark, no Airflow).

A background thread, on its own warehouse connection, beats every ``spec.sink.heartbeat`` under
the sink's fencing token and reads the desired state a person set. It asks the sink to stop when
the desired state is no longer ``running`` (graceful: exit 0), when SIGTERM arrives (graceful),
or when the beat is refused because another instance took the token or the lease was ended
(exit non-zero: this instance must not go on). The micro-batch function holds ``apply_lock``
while it applies, and applies nothing once a stop was asked: a stop therefore always falls
between two micro-batches, and what was not applied is read again from the warehouse's offsets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from tidemark import ledger
from tidemark.protocol.spec import PipelineSpec
from tidemark.sink.lag import sink_lag

log = logging.getLogger(__name__)


class StandingControl:
    def __init__(self, connect: Callable[[], Any], spec: PipelineSpec, fence: int, holder: str, bootstrap: str,
                 realtime: dict[str, int] | None = None):
        self.connect = connect  # a new psycopg2 connection to the warehouse (this thread's own)
        self.spec = spec
        self.realtime = realtime  # the real-time topics the sink reads (a capture group's lead: the group's)
        self.fence = fence
        self.holder = holder
        self.bootstrap = bootstrap  # the broker, for the lag
        self.started_at = datetime.now(timezone.utc)
        self.apply_lock = threading.Lock()
        self.stop_requested = threading.Event()
        self.reason = ""
        self.graceful = True
        self._conn = None
        self._db = threading.Lock()  # the thread and the micro-batches share this connection
        self._thread = threading.Thread(target=self._run, name=f"tidemark-heartbeat-{spec.name}", daemon=True)

    def start(self) -> None:
        if not self._beat(records=0):
            raise ledger.LeaseHeld(f"pipeline {self.spec.name}: fence {self.fence} refused at the first heartbeat")
        self._thread.start()

    def request_stop(self, reason: str, *, graceful: bool = True) -> None:
        if not self.stop_requested.is_set():
            self.reason, self.graceful = reason, graceful
            self.stop_requested.set()
            log.warning("pipeline=%s standing sink (fence %s) stopping: %s", self.spec.name, self.fence, reason)

    def progress(self, records: int, offsets: dict[int, int], batch_seconds: float) -> None:
        """After a micro-batch: its records, the offsets now committed, its duration, and the lag."""
        if not self._beat(records=records, offsets=offsets, batch_seconds=batch_seconds):
            self.request_stop("the heartbeat was refused: another instance holds the fence", graceful=False)

    def finish(self) -> None:
        """The sink has stopped: end the lease so a successor starts at once."""
        self.stop_requested.set()
        self._thread.join(timeout=self.spec.sink.heartbeat.total_seconds() + 5)
        try:
            with self._db, self._connection() as conn, conn.cursor() as cur:
                ledger.end_lease(cur, self.spec.name, self.fence)
        finally:
            if self._conn is not None:
                self._conn.close()

    # --- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        interval = self.spec.sink.heartbeat.total_seconds()
        while not self.stop_requested.wait(interval):
            try:
                with self._db, self._connection() as conn, conn.cursor() as cur:
                    desired = ledger.stream_state(cur, self.spec.name).desired
                if desired != "running":
                    self.request_stop(f"desired state is {desired!r}")
                elif not self._beat(records=0):
                    self.request_stop("the heartbeat was refused: another instance holds the fence or the lease "
                                      "was ended", graceful=False)
            except Exception as exc:  # a warehouse hiccup: the lease holds for six beats, try again
                log.warning("pipeline=%s heartbeat failed (%s: %s); retrying in %.0f s", self.spec.name,
                            type(exc).__name__, exc, interval)
                with self._db:
                    self._drop_connection()

    def _beat(self, *, records: int, offsets: dict[int, int] | None = None,
              batch_seconds: float | None = None) -> bool:
        started = time.monotonic()
        with self._db:
            conn = self._connection()
            # None: the broker cannot tell now
            lag = sink_lag(self.spec, conn, self.bootstrap, timeout_s=2, realtime=self.realtime)
            with conn, conn.cursor() as cur:
                ok = ledger.beat(cur, self.spec.name, self.fence, self.holder, self.started_at, records=records,
                                 lag=lag, offsets=offsets, batch_seconds=batch_seconds)
        if records:
            log.info("pipeline=%s standing sink (fence %s): micro-batch of %s records in %.1f s, lag %s "
                     "(beat in %.2f s)", self.spec.name, self.fence, records, batch_seconds or 0, lag,
                     time.monotonic() - started)
        return ok

    def _connection(self):
        if self._conn is None or self._conn.closed:
            self._conn = self.connect()
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
