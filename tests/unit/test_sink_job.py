"""The batch sink driver's pure parts: a run's totals add up its micro-batches' reports, and the
backlog is unknown while any partition starts from its earliest offset."""

from __future__ import annotations

from tidemark.sink import job
from tidemark.sink.report import MicroBatchReport


def test_a_runs_totals_add_every_micro_batch_and_keep_the_summary_keys():
    total = MicroBatchReport()
    total.add(MicroBatchReport(staged=300, rejected=2, committed=["p:run-1#1"], rejects=[{"reason": "x"}]))
    total.add(MicroBatchReport(staged=5, discarded=7, events=3, duplicates=1, superseded=2, replayed=4,
                               refused=["p:run-2#1"]))
    assert total.totals() == {"staged": 305, "discarded": 7, "rejected": 2, "events": 3, "duplicates": 1,
                              "superseded": 2, "replayed": 4, "committed": ["p:run-1#1"], "refused": ["p:run-2#1"]}
    assert total.rejects == []  # the dead letters themselves stay with their micro-batch


def test_the_backlog_counts_what_is_left_to_read_or_is_unknown_from_earliest(monkeypatch):
    ends = {"t": {0: 10, 1: 4}, "e": {0: 7}}
    monkeypatch.setattr(job, "end_offsets", lambda bootstrap, topic: ends[topic])
    assert job.backlog("b", {"t": {0: 3, 1: 4}, "e": {0: 0}}) == 7 + 0 + 7
    assert job.backlog("b", {"t": {0: 12, 1: 0}}) == 0 + 4  # a stored offset past the end counts nothing
    assert job.backlog("b", {"t": {0: 3, 1: -2}}) is None
