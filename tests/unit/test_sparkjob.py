"""How a Spark entry script fails: an exit code that says whether retrying can help, and one
line of cause for the task that submitted it."""

from __future__ import annotations

import pytest

from tidemark.sparkjob import ERROR_FILE_ENV, JobError, TransientJobError, one_line, run


def _raising(exc):
    def main(argv):
        raise exc
    return main


def test_exit_codes_and_the_cause_file(tmp_path, monkeypatch):
    cause = tmp_path / "cause.txt"
    monkeypatch.setenv(ERROR_FILE_ENV, str(cause))
    assert run(_raising(JobError("table t has no column c")), [], "job") == 3
    assert cause.read_text() == "table t has no column c"
    assert run(_raising(TransientJobError("offsets moved by 2, counted 1")), [], "job") == 4
    with pytest.raises(ZeroDivisionError):
        run(_raising(ZeroDivisionError("division by zero")), [], "job")
    assert cause.read_text() == "ZeroDivisionError: division by zero"


def test_one_line_skips_jvm_frames():
    exc = RuntimeError("\n  at org.apache.spark.Foo(Foo.java:1)\nERROR: permission denied for table t\n  at bar")
    assert one_line(exc) == "RuntimeError: ERROR: permission denied for table t"
