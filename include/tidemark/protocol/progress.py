"""What long work prints: progress lines (rows so far, of how many, percent, rate, time left), step
timings, and one machine-readable summary line per step (``summary_line``, for the demo and for ops
grepping task logs)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def progress_line(tag: str, what: str, done: int, total: int | None, seconds: float) -> str:
    rate = done / seconds if seconds > 0 else 0.0
    if total:
        left = f", about {max(total - done, 0) / rate:.0f}s left" if rate > 0 and done < total else ""
        share = f" of {total} ({100 * done / total:.0f}%)"
    else:
        share, left = "", ""
    return f"{tag}: progress {what} {done}{share} at {rate:,.0f} rows/s after {seconds:.0f}s{left}"


class Ticker:
    """Prints ``progress_line`` every ``every_s`` seconds from a background thread, counting with
    ``count()`` (e.g. how far the topic's offsets moved), until stopped."""

    def __init__(self, tag: str, what: str, count: Callable[[], int], total: int | None, every_s: float = 10.0):
        self.tag, self.what, self.count, self.total, self.every_s = tag, what, count, total, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tidemark-progress", daemon=True)
        self.started = time.monotonic()

    def __enter__(self) -> "Ticker":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                done = self.count()
            except Exception as why:  # progress is advice: never fail the work for it
                print(f"{self.tag}: progress unavailable ({why})", flush=True)
                continue
            print(progress_line(self.tag, self.what, done, self.total, time.monotonic() - self.started), flush=True)


class Steps:
    """Seconds spent per named step of one piece of work, for its log line ("checks 1.2 s, copy 0.3 s"):
    the next bottleneck is visible in the job log without a profiler."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - started

    def rounded(self) -> dict[str, float]:
        return {name: round(s, 2) for name, s in self.seconds.items()}

    def __str__(self) -> str:
        return ", ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items()) or "no steps"


# One machine-readable line per step, for the demo summary and for ops grepping task logs.
MARKER = "tidemark-summary"


def summary_line(step: str, **facts: object) -> str:
    return f"{MARKER} {json.dumps({'step': step, **facts}, sort_keys=True, default=str)}"


def parse_summaries(text: str) -> list[dict]:
    """Summary lines found in a log, in order; tolerant of log prefixes and suffixes."""
    return [json.loads(m) for m in re.findall(rf"{MARKER} (\{{.*?\}})(?=\s*(?:\[|$))", text, flags=re.M)]


def byte_size(n: float) -> str:
    """Bytes as a person reads them (units of 1024): 512 B, 16.0 KiB, 1.5 MiB, 3072.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
