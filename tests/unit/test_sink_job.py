"""The batch sink driver's pure parts: a run's totals add up its micro-batches' reports, the
backlog is unknown while any partition starts from its earliest offset, and an overlapped apply
that failed or came after a stop lets no later one commit."""

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


class _Control:
    """The life line's part the overlapped apply uses."""

    def __init__(self):
        import threading

        self.apply_lock, self.stop_requested, self.beats = threading.Lock(), threading.Event(), 0

    def progress(self, *_):
        self.beats += 1


class _Sink:
    """Refuses the micro-batches in ``refuse``; records which it applied."""

    def __init__(self, refuse=()):
        self.refuse, self.applied = set(refuse), []

    def apply(self, table, epoch_id, *_):
        if epoch_id in self.refuse:
            raise RuntimeError(f"micro-batch {epoch_id} refused")
        self.applied.append(epoch_id)
        return MicroBatchReport()

    def committed_offsets(self):
        return {}


def _overlapped(sink, control):
    from types import SimpleNamespace

    reader = SimpleNamespace(close=lambda: None)
    return job.MicroBatches(sink, SimpleNamespace(name="p"), control, {}, None, reader=reader)


def _apply(batches, epoch_id):
    import pyarrow as pa

    from tidemark.protocol.progress import Steps

    table = pa.table({"topic": ["tidemark.cdc.p.public.t"]})
    return batches._applying.submit(batches._apply_in_turn, table, None, epoch_id, Steps(), 0.0)


def test_after_a_failed_overlapped_apply_none_follows_and_the_failure_ends_the_job():
    """An apply that failed on its thread: a later micro-batch already handed over is not applied
    (its offsets would pass the failed one's records), and the error is raised wherever asked."""
    import pytest

    sink, control = _Sink(refuse={1}), _Control()
    batches = _overlapped(sink, control)
    _apply(batches, 0).result()
    failed, later = _apply(batches, 1), _apply(batches, 2)
    later.result()
    assert isinstance(failed.exception(), RuntimeError) and sink.applied == [0] and control.beats == 1
    with pytest.raises(RuntimeError, match="micro-batch 1 refused"):
        batches.raise_failure()  # the stream's loop, within a second
    with pytest.raises(RuntimeError, match="micro-batch 1 refused"):
        batches.close()
    batches.close(raising=False)  # the job's finally: no second raise


def test_no_overlapped_apply_runs_after_a_stop():
    sink, control = _Sink(), _Control()
    batches = _overlapped(sink, control)
    _apply(batches, 0).result()
    control.stop_requested.set()
    _apply(batches, 1).result()
    batches.close()
    assert sink.applied == [0]
