"""What the stream supervisor does about one pipeline: desired state against actual state.

Pure logic (no database, no process, no Airflow): the supervisor DAG gathers the facts (the
desired state a person set, the launcher's process status, the heartbeat and progress the sink
writes to the control schema, the restarts it made) and acts on the ``Decision`` this returns.

The rules carry the Flink Kubernetes operator's lessons:
- a stall is only a stall when lag grows (or stays) with no progress for longer than a window
  derived from the job's own trigger interval (never shorter: that restarts healthy jobs), and a
  healthy idle job (no lag) is never a stall however old its last progress;
- a job stopped or paused on purpose is never restarted, and a job that ended is never "health
  checked" into a loop: restarts are budgeted (N within M), with exponential backoff, and past the
  budget the pipeline is crash-looping until a person clears it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from tidemark.protocol.errors import EXIT_OUTAGE

OUTAGE_START = "it ended for an outage"  # how a start after an outage begins its reason (the ledger counts these)
OUTAGE_STARTS_PER_RESTART = 4  # starts after outages allowed per restart of the budget, within its window

DesiredState = Literal["running", "paused", "stopped"]
ActionKind = Literal["none", "start", "restart", "reconfigure", "stop", "wait", "crash_loop"]


@dataclass(frozen=True)
class Policy:
    trigger_interval: timedelta  # the stream's micro-batch trigger
    heartbeat_timeout: timedelta = timedelta(minutes=2)  # a live process that stopped beating is hung
    stall_factor: int = 10  # stalled after this many trigger intervals without progress while lagging ...
    min_stall: timedelta = timedelta(minutes=2)  # ... and never sooner than this
    restart_budget: int = 3  # at most this many restarts ...
    budget_window: timedelta = timedelta(minutes=30)  # ... within this window, else crash-looping
    backoff: timedelta = timedelta(seconds=15)  # wait before restart n: backoff * 2^(n-1) ...
    max_backoff: timedelta = timedelta(minutes=5)  # ... at most this

    def __post_init__(self) -> None:
        if self.trigger_interval <= timedelta(0):
            raise ValueError(f"trigger interval must be positive, got {self.trigger_interval}")
        if self.stall_after <= self.trigger_interval:
            raise ValueError(f"stall window {self.stall_after} must exceed the trigger interval "
                             f"{self.trigger_interval}, or every healthy job looks stalled")
        if self.heartbeat_timeout <= self.trigger_interval:
            raise ValueError(f"heartbeat timeout {self.heartbeat_timeout} must exceed the trigger interval "
                             f"{self.trigger_interval}")
        if self.restart_budget < 1:
            raise ValueError("restart budget must allow at least one restart")

    @property
    def stall_after(self) -> timedelta:
        return max(self.trigger_interval * self.stall_factor, self.min_stall)

    def backoff_for(self, restarts: int) -> timedelta:
        """The wait before the next restart, after ``restarts`` restarts within the budget window."""
        if restarts <= 0:
            return timedelta(0)
        return min(self.backoff * (2 ** (restarts - 1)), self.max_backoff)


@dataclass(frozen=True)
class Actual:
    """What the supervisor sees of the job now."""

    alive: bool  # the process (local) or the driver (cluster) runs
    started_at: datetime | None = None  # when this instance was launched (None: never)
    exit_code: int | None = None  # how the last instance ended, when it has
    heartbeat_at: datetime | None = None  # the instance's last heartbeat in the control schema
    progress_at: datetime | None = None  # its last micro-batch that read records
    lag: int | None = None  # records on the topic beyond the offsets committed in the warehouse
    previous_lag: int | None = None  # the same, at the supervisor's previous look
    outage: str | None = None  # a component the job needs that does not answer now (the broker), and why
    lagging_since: datetime | None = None  # since when the supervisor has seen it with records to read, unbroken
    other_instance: str | None = None  # a live heartbeat of an instance this launcher does not know (who, since)


@dataclass(frozen=True)
class History:
    restarts: tuple[datetime, ...] = ()  # restarts the supervisor made, any age
    crash_looping_since: datetime | None = None  # set past the budget; only a person clears it
    desired_since: datetime | None = None  # when a person last set the desired state
    outage_starts: tuple[datetime, ...] = ()  # starts after an outage (exit 75), on a budget of their own


@dataclass(frozen=True)
class Decision:
    action: ActionKind
    reason: str
    recent_restarts: int = 0
    not_before: datetime | None = None  # for "wait": when a restart may happen
    details: dict[str, str] = field(default_factory=dict)




def decide(now: datetime, desired: DesiredState, actual: Actual, history: History, policy: Policy) -> Decision:
    """The one action for this pipeline now, and why (the reason goes into the supervisor's log line)."""
    recent = [t for t in history.restarts if now - t <= policy.budget_window]
    n = len(recent)
    if desired != "running":
        if actual.alive:
            return Decision("stop", f"desired {desired}: stopping the running instance gracefully", n)
        return Decision("none", f"desired {desired}: not running, as wanted (never restarted)", n)
    if history.crash_looping_since is not None:
        return Decision("crash_loop", f"crash-looping since {history.crash_looping_since.isoformat()}: not "
                        "restarted until a person clears it", n)

    why = _trouble(now, actual, policy)
    if why is None:
        return Decision("none", "healthy", n)
    if not actual.alive and actual.other_instance is not None:
        # liveness from the job itself: the launcher may not see a copy started elsewhere (by hand, another
        # launcher, a process escaped from its group), and a second one never starts beside a live one
        return Decision("wait", f"not running from here, but an instance still beats ({actual.other_instance}): "
                        "no second one starts beside it; started once its heartbeat stops. Next, if that copy "
                        "should not run: end its process", n)
    if not actual.alive and (actual.started_at is None or (
            history.desired_since is not None and actual.started_at < history.desired_since)):
        # never launched, or ended before a person (re)set it running (a resume): a start, not a restart
        return Decision("start", "not running: starting it" if actual.started_at is None else
                        f"resumed at {history.desired_since.isoformat()}: starting it", n)
    # an outage is waited out, not counted: the budget is for the job's own failures (Kafka Connect's and
    # Flink's restart strategies do the same); a restart now would only fail again
    if actual.outage is not None:
        return Decision("wait", f"{why}; waiting for {actual.outage}: started again once it answers (an outage "
                        "is not counted against the restart budget)", n)
    if not actual.alive and actual.exit_code == EXIT_OUTAGE:
        starts = [t for t in history.outage_starts if now - t <= policy.budget_window]
        limit = OUTAGE_STARTS_PER_RESTART * policy.restart_budget
        if len(starts) < limit:  # backed off as restarts are, on a budget of their own
            wait = policy.backoff_for(len(starts))
            if starts and now < max(starts) + wait:
                return Decision("wait", f"it ended for an outage (exit {EXIT_OUTAGE}); backing off until "
                                f"{(max(starts) + wait).isoformat()}", n, not_before=max(starts) + wait)
            return Decision("start", f"{OUTAGE_START} (exit {EXIT_OUTAGE}: a component it needs did not answer), which "
                            f"is over: starting it again ({len(starts) + 1} of {limit} such starts within "
                            f"{policy.budget_window}, not counted against the restart budget)", n)
        # an 'outage' that keeps coming while every component answers is the job's own (a session timeout, a
        # watchdog killing its connection): from here on it counts
        why = (f"it ended for an outage (exit {EXIT_OUTAGE}) {len(starts)} times within {policy.budget_window} while "
               "every component answers: counted as its own failure")
    if n >= policy.restart_budget:
        return Decision("crash_loop", f"{why}; {n} restarts within {policy.budget_window} already (budget "
                        f"{policy.restart_budget}): crash-looping, not restarted until a person clears it", n)
    wait = policy.backoff_for(n)
    if recent and now < max(recent) + wait:
        until = max(recent) + wait
        return Decision("wait", f"{why}; backing off until {until.isoformat()} (restart {n + 1} of "
                        f"{policy.restart_budget} within {policy.budget_window})", n, not_before=until)
    return Decision("restart", why, n)


def _trouble(now: datetime, actual: Actual, policy: Policy) -> str | None:
    """What is wrong with a job that should run, or None when it runs as it should."""
    if not actual.alive:
        if actual.started_at is None:
            return "not running: starting it"
        ended = "ended" if actual.exit_code is None else f"exited with code {actual.exit_code}"
        return f"{ended}: restarting"
    beat = actual.heartbeat_at or actual.started_at
    if beat is not None and now - beat > policy.heartbeat_timeout:
        return f"alive but no heartbeat for {_secs(now - beat)} (timeout {_secs(policy.heartbeat_timeout)}): hung"
    if not actual.lag:
        return None  # idle or caught up: an old last progress is no stall
    growing = actual.previous_lag is None or actual.lag >= actual.previous_lag
    # from its first committed micro-batch: a JVM starting on a loaded host is slow, not stalled (its
    # heartbeat says it lives); one that never commits is stalled only after a start-up grace of two windows more
    since = actual.progress_at or (actual.started_at + 2 * policy.stall_after if actual.started_at else None)
    if since is not None and actual.lagging_since is not None:  # idle until records came: busy since then
        since = max(since, actual.lagging_since)
    if growing and since is not None and now - since > policy.stall_after:
        return (f"stalled: lag {actual.lag} records and not shrinking, no progress for {_secs(now - since)} "
                f"(stall window {_secs(policy.stall_after)} = max({policy.stall_factor} x trigger "
                f"{_secs(policy.trigger_interval)}, {_secs(policy.min_stall)}))")
    return None


def _secs(value: timedelta) -> str:
    """Whole seconds, but a fraction below ten (a 0.5 s trigger is not "0 s")."""
    seconds = value.total_seconds()
    return f"{seconds:.1f} s" if seconds < 10 and seconds != int(seconds) else f"{seconds:.0f} s"
