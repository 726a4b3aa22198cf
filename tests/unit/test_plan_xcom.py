"""A batch step that cannot read its run's plan fails at once, says why and what to clear."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tidemark_airflow.batch_tasks import run_plan


def _context(raw):
    return {"ti": SimpleNamespace(xcom_pull=lambda task_ids: raw)}


@pytest.mark.parametrize("raw", [
    {"batch_id": "p:r", "window": {"lo": {"cursor": 6, "pk": None}, "hi": {"cursor": 4, "pk": None}}},
    {"window": {"lo": {"cursor": 1, "pk": None}, "hi": {"cursor": 4, "pk": None}}},
    {"batch_id": "p:r", "window": "not a window"},
])
def test_an_unreadable_plan_is_a_terminal_failure_naming_the_cause_and_the_task_to_clear(raw):
    """Issue 29: a plan with lo after hi failed begin with a ValueError outside Tidemark's wrapper, so
    Airflow retried it three times and the last line said 'check the stack'."""
    with pytest.raises(AirflowFailException, match=r"the plan of task 'plan' in this run cannot be read \(.+\); "
                                                   r"nothing was begun from it\. Next: clear the run from 'plan'"):
        run_plan(_context(raw))


def test_a_readable_plan_and_a_missing_one():
    raw = {"batch_id": "p:r", "window": {"lo": {"cursor": 1, "pk": None}, "hi": {"cursor": 4, "pk": None}}}
    assert run_plan(_context(raw)).window.hi.cursor == 4
    assert run_plan(_context(None), required=False) is None


def test_a_handoff_plan_travels_whole_and_the_extract_report_must_agree_with_it():
    """Issue 31: the handoff mark survives XCom; END is refused when the extract's report and the
    ledger's plan disagree on it (a handoff position recorded for an ordinary batch, or none for a handoff)."""
    from tidemark.batch import steps
    from tidemark.protocol.control import ProtocolError
    from tidemark.protocol.spec import PipelineSpec

    raw = {"batch_id": "p:r", "window": {"lo": {"cursor": 1, "pk": None}, "hi": {"cursor": 4, "pk": None}},
           "handoff": True}
    plan = run_plan(_context(raw))
    assert plan.handoff and steps.Plan.from_xcom(plan.to_xcom()) == plan
    spec = PipelineSpec.model_validate({"name": "p", "table": "public.t", "primary_key": ["id"], "partitions": 1,
                                        "cursor": {"kind": "id", "column": "id"}, "target_table": "public.t_tgt",
                                        "safe_lag": "PT0S", "append_only": True})
    report = {"totals": {"0": {"rows": 0, "checksum": 0}}}
    with pytest.raises(ProtocolError, match="the ledger plans a CDC handoff, the extract reported none"):
        steps.record_extract(spec, None, plan, 1, report)
    ordinary = steps.Plan.from_xcom({**raw, "handoff": False})
    with pytest.raises(ProtocolError, match="the ledger plans no CDC handoff, the extract reported one"):
        steps.record_extract(spec, None, ordinary, 1, {**report, "handoff": {"slot": "s", "consistent_point": "0/1"}})


def test_the_last_line_promises_a_retry_only_when_airflow_will_retry():
    """Issue 53 item 6: the last try's line still said 'Next: Airflow retries this task with backoff'."""
    from tidemark_airflow.batch_tasks import NEXT_TRANSIENT, truthful

    line = "pipeline=p batch=b attempt=2 window=(1, 4]: KafkaException: broker down. Next: " + NEXT_TRANSIENT.format(
        task="begin")
    retrying = truthful(line, True, 2, 4)
    assert "Airflow retries this task with backoff (try 2 of 4 failed); if the last try fails too, check the stack" \
        in retrying
    final = truthful(line, False, 4, 4)
    assert "retries" not in final and "no retry is left (try 4 of 4 failed): check the stack" in final
    assert final.endswith("then clear this DAG run from 'begin'")
    assert truthful("pipeline=p: ValueError: x. Next: fix it", False, 1, 1) == "pipeline=p: ValueError: x. Next: fix it"


def test_a_failed_tasks_closing_lines_say_the_cause_in_words_and_end_with_the_retry_and_next_step():
    """Issue 53 item 6: the last line named no attempt, gave librdkafka's raw error and ran off the log
    view's right edge. Now: the whole line, then two short ones (what failed in words; retry and next)."""
    from tidemark_airflow.batch_tasks import NEXT_TRANSIENT, SHORT, closing_lines

    raw = ("KafkaException: KafkaError{code=_TRANSPORT,val=-195,str=\"Failed to get metadata: Local: Broker "
           "transport failure\"}")
    line = f"pipeline=p batch=b attempt=2 window=(1, 4]: {raw}. Next: " + NEXT_TRANSIENT.format(task="begin")
    whole, failed, next_line = closing_lines(line, True, 2, 4)
    assert raw in whole and "attempt=2" in whole
    assert failed == ("TIDEMARK FAILED pipeline=p batch=b attempt=2 window=(1, 4]: the connection to the Kafka broker "
                      "failed (the raw error is in the line above)")
    assert next_line.startswith("TIDEMARK NEXT (try 2 of 4 failed; Airflow retries it with backoff): if the last "
                                "try fails too, check the stack")
    _, _, final = closing_lines(line, False, 4, 4)
    assert final.startswith("TIDEMARK NEXT (try 4 of 4 failed; no retry is left): check the stack") and "retries" not in final
    _, refused, at_once = closing_lines("pipeline=p batch=b attempt=1 window=(1, 4]: REFUSED " + "x" * 400
                                       + ". Next: fix the cause named here", False, 1, 3)
    assert len(refused) <= SHORT + 60 and refused.endswith("(whole in the line above)")
    assert at_once == "TIDEMARK NEXT (try 1 of 3 failed; not retried: the same input fails the same way): fix the cause named here"


def test_raw_errors_in_words():
    from tidemark.protocol.errors import in_words

    assert in_words("OperationalError: connection to server at \"127.0.0.1\", port 25432 failed: Connection "
                    "refused") == "a database or service refused the connection (is it running?)"
    assert in_words("KafkaError{code=_MSG_TIMED_OUT,val=-192}") == "the Kafka broker did not acknowledge a record in time"
    assert in_words("REFUSED: partition 0 differs") is None
