"""What every task of a pipeline's batch DAG shares: the run's plan and attempt from XCom, the tag its log
lines start with, and the one last line a failure leaves for the person on call (what failed, the next step
that will work), failing at once where a retry cannot heal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from tidemark.batch.sequence import BEGIN, EXTRACT, PLAN
from tidemark_airflow.spark import SparkJobFailed

# What to do next, per step, once Airflow has given up (or at once, for what will not heal).
NEXT_TRANSIENT = ("Airflow retries this task with backoff; if the last try fails too, check the stack "
                  "(`make status`, `make logs C=kafka` or `C=postgres`), then clear this DAG run from '{task}'")
NEXT_FIX_THEN_CLEAR = "fix the cause named here, then clear this DAG run from '{task}' (it loads a new attempt)"


class BatchTaskError(RuntimeError):
    """A transient failure of a batch step, with the context the person on call needs."""


def deterministic(exc: BaseException) -> bool:
    """Errors that the same input reproduces: retrying only delays the page. Tidemark's own say so by
    their kind (``tidemark.protocol.errors``); a Spark job's by its exit code."""
    import psycopg2

    from tidemark.protocol.errors import Terminal, Transient

    if isinstance(exc, SparkJobFailed):
        return exc.deterministic
    if isinstance(exc, (Terminal, Transient)):
        return isinstance(exc, Terminal)
    # Not yet given a kind: a builtin ValueError (a topic with another partition count, an invalid
    # value) or LookupError (a missing table) from Tidemark's code, and the database's own verdicts
    # on a statement, fail again on the same input.
    return isinstance(exc, (LookupError, ValueError, psycopg2.ProgrammingError, psycopg2.DataError,
                            psycopg2.IntegrityError))


def failure_line(exc: BaseException) -> str:
    if isinstance(exc, SparkJobFailed):
        return str(exc)
    from tidemark.spark.entry import one_line

    return one_line(exc)


@contextmanager
def on_call(log, tag: str, next_step: str, *, clear_from: str = "begin") -> Iterator[None]:
    """Turn any failure into one last line for the person on call: what failed and what to do.

    ``clear_from``: where a run must be cleared once Airflow gave up (after the teardown aborted
    the attempt, only a new attempt from 'begin' can load the batch)."""
    try:
        yield
    except (AirflowSkipException, AirflowFailException):
        raise
    except Exception as exc:
        if deterministic(exc):
            log.error("%s FAILED (will not heal by retrying): %s. Next: %s", tag, failure_line(exc), next_step)
            raise AirflowFailException(f"{tag}: {failure_line(exc)}. Next: {next_step}") from exc
        then = NEXT_TRANSIENT.format(task=clear_from)
        log.error("%s FAILED: %s. Next: %s", tag, failure_line(exc), then)
        raise BatchTaskError(f"{tag}: {failure_line(exc)}. Next: {then}") from exc


def last_word(context) -> None:
    """on_failure_callback / on_retry_callback: a failed task's log ends with Tidemark's one line
    (pipeline, batch, attempt, window, cause, next step), after Airflow's own traceback, so the
    person on call reads it last whatever failed."""
    exc = context.get("exception")
    if exc is None:
        return
    text = str(exc) if isinstance(exc, (AirflowFailException, BatchTaskError)) else failure_line(exc)
    if "pipeline=" not in text:  # a failure outside on_call (a sensor's timeout, a killed worker)
        pipeline = context["dag"].dag_id.removeprefix("tidemark_batch_")
        text = (f"pipeline={pipeline} run={context['dag_run'].run_id} task {context['ti'].task_id}: {text}. Next: "
                + NEXT_TRANSIENT.format(task=BEGIN))
    retried = str(getattr(context["ti"], "state", "")).lower().endswith("up_for_retry")
    log = context["task"].log
    log.info("::endgroup::")  # out of Airflow's folded "Post Execute" group: these lines show without a click
    for line in closing_lines(text, retried, getattr(context["ti"], "try_number", None),
                              getattr(context["task"], "retries", 0) + 1):
        log.error("%s", line)


SHORT = 160  # what the log view shows without scrolling sideways (1,400 px wide, beside the task list)


def closing_lines(text: str, retried: bool, try_number: int | None, tries: int) -> list[str]:
    """A failed task's last lines: the whole line (every detail, the raw error in it); then what failed and
    why in words, and whether Airflow retries and what to do, each short enough to read in the log view."""
    from tidemark.protocol.errors import in_words

    whole = truthful(text, retried, try_number, tries)
    head, _, rest = text.partition(": ") if text.startswith("pipeline=") else ("", "", text)
    cause, _, next_step = rest.rpartition(". Next: ") if ". Next: " in rest else (rest, "", "")
    words = in_words(cause)
    said = f"{words} (the raw error is in the line above)" if words else _short(cause, SHORT)
    which = f"try {try_number} of {tries} failed" if try_number else "a try failed"
    if retried:
        when = f"{which}; Airflow retries it with backoff"
        next_step = next_step.replace(_RETRY_PROMISE, "if the last try fails too, ")
    elif _RETRY_PROMISE in next_step:
        when, next_step = f"{which}; no retry is left", next_step.replace(_RETRY_PROMISE, "")
    else:
        when = f"{which}; not retried: the same input fails the same way"
    return [f"TIDEMARK FAILED: {whole}",
            f"TIDEMARK FAILED {head}: {said}" if head else f"TIDEMARK FAILED: {said}",
            f"TIDEMARK NEXT ({when}): {next_step or 'read the lines above'}"]


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 30].rstrip() + " ... (whole in the line above)"


_RETRY_PROMISE = "Airflow retries this task with backoff; if the last try fails too, "


def truthful(text: str, retried: bool, try_number: int | None, tries: int) -> str:
    """The last line's next step as it stands now: a retry is promised only when Airflow will retry,
    and the line names which try failed (issue 53: the last try's line still said "Airflow retries")."""
    at = text.find(_RETRY_PROMISE)
    if at < 0:
        return text
    which = f"try {try_number} of {tries}" if try_number else f"a try of {tries}"
    rest = text[at + len(_RETRY_PROMISE):]
    if retried:
        return f"{text[:at]}Airflow retries this task with backoff ({which} failed); if the last try fails too, {rest}"
    return f"{text[:at]}no retry is left ({which} failed): {rest}"


def run_plan(context, *, required: bool = True) -> Any:
    from tidemark.batch.steps import Plan

    raw = context["ti"].xcom_pull(task_ids=PLAN)
    if not raw:
        if not required:
            return None
        raise AirflowFailException(f"no plan from task '{PLAN}' in this run; clear the run from '{PLAN}'")
    try:
        return Plan.from_xcom(raw)
    except (KeyError, TypeError, ValueError) as exc:  # the same XCom fails every retry: say so at once
        raise AirflowFailException(
            f"the plan of task '{PLAN}' in this run cannot be read ({type(exc).__name__}: {exc}); nothing was begun "
            f"from it. Next: clear the run from '{PLAN}' (it plans the window again)") from exc


def run_tag(spec, plan, attempt: int | None = None) -> str:
    return (f"pipeline={spec.name} batch={plan.batch_id}" + (f" attempt={attempt}" if attempt else "")
            + f" window={plan.window}")


def run_attempt(context) -> int:
    extracted = context["ti"].xcom_pull(task_ids=EXTRACT)
    if not extracted:
        raise AirflowFailException(f"no attempt from task '{EXTRACT}' in this run; clear the run from '{BEGIN}'")
    return int(extracted["attempt"])
