"""Progress lines say rows so far, of how many, percent, rate and time left."""

from __future__ import annotations

from tidemark.protocol.progress import progress_line


def test_a_line_with_a_known_total():
    line = progress_line("pipeline=p batch=b attempt=1", "written to Kafka", 250_000, 1_000_000, 10.0)
    assert line == ("pipeline=p batch=b attempt=1: progress written to Kafka 250000 of 1000000 (25%) "
                    "at 25,000 rows/s after 10s, about 30s left")


def test_a_line_without_a_total_or_a_rate():
    assert progress_line("t", "staged", 0, None, 0.0) == "t: progress staged 0 at 0 rows/s after 0s"


def test_steps_add_up_per_name_in_the_order_they_first_ran():
    from tidemark.protocol.progress import Steps

    steps = Steps()
    for name in ("read", "checks", "read"):
        with steps.step(name):
            pass
    assert list(steps.seconds) == ["read", "checks"] and all(s >= 0 for s in steps.seconds.values())
    assert str(steps).startswith("read 0.0 s, checks 0.0 s")
    assert str(Steps()) == "no steps"
