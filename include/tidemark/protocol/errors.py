"""One taxonomy of failure for every layer: what Tidemark raises says whether trying again can help.

``Terminal``: the same input fails the same way (a bad spec, a plan the tables refuse, a batch the
sink refused, a forged control message): a retry only delays the page, and the message names what
to fix. ``Transient``: a later try may heal it (a broker or cluster away, a write retried across a
broker restart, offsets that moved under the extract). The Airflow layer fails a task at once on
``Terminal`` and lets Airflow retry ``Transient`` (``tidemark_airflow.batch.on_call``); a Spark
entry script exits 3 for ``Terminal`` and 4 for ``Transient`` (``tidemark.spark.entry.run``), so the
task that submitted it can tell them apart.

Errors that are not Tidemark's own (a driver's, the broker client's) are judged at the Airflow
layer by their kind; a builtin ``ValueError`` or ``LookupError`` raised by Tidemark's code counts as
terminal there until it is given a class of its own here.
"""

from __future__ import annotations


class TidemarkError(Exception):
    """Every failure Tidemark raises on purpose: its message says what failed and what to do."""


class Terminal(TidemarkError):
    """The same input fails again: fix what the message names."""


class Transient(TidemarkError):
    """A later try may succeed: Airflow retries it, a new attempt of the batch is safe."""


EXIT_OUTAGE = 75  # sysexits' EX_TEMPFAIL: a standing job ended because a component it needs does not answer
# The job's last line when it ends for an outage: a Spark master keeps a driver's state, not its exit
# code, so the standalone launcher reads this line in the driver's log to tell an outage from a failure.
OUTAGE_LINE = f"ended for an outage (exit {EXIT_OUTAGE})"


class Outage(Transient):
    """A component a standing job needs (the broker, the warehouse) does not answer: the job exits
    ``EXIT_OUTAGE`` and its supervisor starts it again once the component answers, outside the restart
    budget, which counts the job's own failures."""


# A component's raw error, said in words for the person on call (the raw text stays beside it): the first
# rule whose every fragment the error contains (lower case) names it.
_IN_WORDS = (
    (("_all_brokers_down",), "no Kafka broker answered"),
    (("_transport",), "the connection to the Kafka broker failed"),
    (("_msg_timed_out",), "the Kafka broker did not acknowledge a record in time"),
    (("kafkaerror", "_timed_out"), "the Kafka broker did not answer in time"),
    (("kafka", "connection refused"), "the Kafka broker refused the connection (is it running?)"),
    (("kafkaerror",), "the Kafka client failed"),
    (("connection refused",), "a database or service refused the connection (is it running?)"),
    (("could not connect",), "a database could not be reached"),
    (("server closed the connection",), "a database closed the connection (restarted or stopped?)"),
    (("terminating connection",), "a database ended the connection (restarted or stopped?)"),
    (("timeout expired",), "a database did not answer in time"),
    (("statement timeout",), "a query ran past its statement timeout"),
    (("password authentication failed",), "a database refused the login (wrong password?)"),
    (("permission denied for",), "a database refused the login's rights"),
    (("numeric field overflow",), "a value does not fit its target column's type"),
    (("value too long",), "a text value is longer than its target column allows"),
    (("deadlock detected",), "two transactions deadlocked; one was cancelled"),
    (("no space left",), "a disk is full"),
    (("outofmemoryerror",), "the JVM ran out of memory"),
)


def in_words(raw: str) -> str | None:
    """What a raw error from a driver or client means, in words; None when it is not one Tidemark knows
    (then the raw text is the cause as it stands)."""
    text = raw.lower()
    for fragments, words in _IN_WORDS:
        if all(f in text for f in fragments):
            return words
    return None
