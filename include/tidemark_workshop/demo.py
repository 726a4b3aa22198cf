"""`make demo`: the nightly batch of the core-banking demo, run through Airflow.

Seeds the source (tidemark_workshop.bank), starts concurrent writers and a transaction held open longer
than the safe lag, starts the Airflow services (api-server, scheduler, dag-processor, triggerer)
and runs every nightly pipeline DAG through the scheduler while they write (its scheduled run, or
a manual run made through the REST API as the UI makes it), prints per pipeline the window, batch
id, rows, ledger state and watermark, then proves the target holds exactly the source rows up to
the watermark. The writers also publish payment events: the demo proves that the serving view
(the batch target merged with the events after its watermark) equals the source row for row, and
that a malformed event is a dead letter while the next one lands.
bank_ledger_entries' sink stands under the tidemark_supervisor DAG: the demo prints
each pipeline's status line, kills that sink with kill -9 and waits for the supervisor to restart
it. bank_accounts is captured by change data capture (its first nightly run is the handoff, under
the writers): an update and a delete at the source reach serving.accounts in seconds, and a kill -9
of the Connect worker loses and repeats no change. The services stay up afterwards, so the runs and
their logs can be read in the UI.
``run_dag`` runs a DAG with `airflow dags test` (the smoke test uses it).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tidemark.protocol.progress import parse_summaries
from tidemark_workshop.settings import Settings
from tidemark_workshop.stack.airflow import AirflowUI, RestApi
from tidemark_workshop.stack.proc import StackError

PIPELINES = ("bank_customers", "bank_accounts", "bank_ledger_entries", "bank_daily_balances")


def run_dag(dag_id: str, settings: Settings) -> tuple[str, float, list[dict]]:
    log = settings.logs_dir / f"demo-{dag_id}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "w") as out:
        # cwd: Spark leaves an artifacts/ directory wherever it runs
        proc = subprocess.run(
            ["airflow", "dags", "test", dag_id], stdout=out, stderr=subprocess.STDOUT, cwd=settings.state_dir
        )
    text = log.read_text(errors="replace")
    found = re.findall(rf"DagRun Finished: dag_id={re.escape(dag_id)},.*?state=(\w+)", text)
    state = found[-1] if found else "no run"
    if proc.returncode != 0:
        state = f"{state} (airflow exited {proc.returncode})"
    return state, time.monotonic() - t0, parse_summaries(text)


def _run_pipeline(settings: Settings, api, name: str, *, quiet: bool = False) -> bool:
    """One nightly DAG through the real scheduler: unpaused, its scheduled run for the last interval
    if the scheduler creates one now, else a manual run as the UI's Trigger button makes it (always,
    once the writers stopped: ``quiet``). Under the writers, a reconciliation that could compare
    nothing (every key moved on since the batch read it) is not a pass: the run after the writers
    stop must compare and pass."""
    import psycopg2

    from tidemark.batch import steps
    from tidemark.ledger import batch_id_for
    from tidemark_workshop.settings import WAREHOUSE_DB

    dag_id, reconcile_id = f"tidemark_batch_{name}", f"tidemark_reconcile_{name}"
    api.wait_for(f"{dag_id} to be parsed", lambda: api.exists(dag_id), timeout_s=180)
    api.wait_for(f"{reconcile_id} to be parsed", lambda: api.exists(reconcile_id), timeout_s=180)
    api.call("PATCH", f"/dags/{reconcile_id}", {"is_paused": False})  # scheduled by the batch's Asset event
    before = {r["dag_run_id"] for r in api.runs(reconcile_id)}
    api.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})
    t0 = time.monotonic()
    try:
        if quiet:
            raise StackError("the catch-up run is a manual one")
        run = api.wait_for("a scheduled run", lambda: [r for r in api.runs(dag_id, run_type="scheduled")
                                                      if r["state"] in ("queued", "running")], timeout_s=10)[0]
        run_id = run["dag_run_id"]
    except StackError:  # this interval's scheduled run exists already (an earlier demo today)
        run_id = api.trigger(dag_id)
    kind = run_id.split("__")[0]
    print(f"{dag_id}: {kind} run {run_id} through the scheduler ...", flush=True)
    state = api.wait_finished(dag_id, run_id, timeout_s=900)["state"]
    print(f"  {state} in {time.monotonic() - t0:.1f}s")
    if state != "success":
        failed = [t for t in api.task_instances(dag_id, run_id) if t["state"] == "failed"]
        for t in failed:
            lines = [ln for ln in api.log_text(dag_id, run_id, t["task_id"], t["try_number"]).splitlines()
                     if ln.strip() and not ln.startswith("::")]  # not the log's ::group:: markers
            told = [ln for ln in lines if "Next:" in ln] or lines  # the task's own last line: cause and next step
            print(f"  task {t['task_id']} failed: {told[-1] if told else '(no log)'}")
        return False
    wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        facts = steps.summary(wh, batch_id_for(name, run_id))
    finally:
        wh.close()
    print(f"  window {facts['window']}\n  batch {facts['batch_id']} attempt {facts['attempt']}: {facts['state']}, "
          f"rows={facts['rows']}, watermark {facts['watermark']}, transport {facts['transport']}")
    runs = api.wait_for(f"{reconcile_id}'s run scheduled by the batch", lambda: [
        r for r in api.runs(reconcile_id, run_type="asset_triggered") if r["dag_run_id"] not in before], timeout_s=120)
    passed, line = _reconciliation(api, reconcile_id, runs[-1]["dag_run_id"])
    print(f"  {reconcile_id}: {line}")
    compared = re.search(r"reconciled[^,]*, (\d+) rows", line)
    if quiet and passed and (compared is None or int(compared.group(1)) == 0):
        print(f"  {reconcile_id} compared no row once the writers stopped: MISMATCH")
        passed = False
    if not quiet and not passed and re.search(r"checks failed \(compared_rows\)", line):
        # every key changed since the batch read it: nothing could be compared under the writers (a failure,
        # never "OK"); the run after the writers stop reads their last versions and must compare them
        print(f"  every key of {name} moved on under the writers since the batch read it: proven by the run after "
              "they stop", flush=True)
        passed = True
    return facts["state"] == "committed" and passed


def _reconciliation(api, dag_id: str, run_id: str, task_id: str = "reconcile") -> tuple[bool, str]:
    """A reconciliation run's verdict: the task's own verdict line (counts, report, Data Docs)."""
    state = api.wait_finished(dag_id, run_id, timeout_s=900)["state"]
    tries = [t for t in api.task_instances(dag_id, run_id) if t["task_id"] == task_id]
    text = api.log_text(dag_id, run_id, task_id, tries[0]["try_number"]) if tries else ""
    verdicts = re.findall(
        r"(\S+ batch \S+: (?:reconciled|nothing to compare yet|\d+ rows differ|\d+ of \d+ checks failed)[^\n\"]*)", text)
    return state == "success", verdicts[-1].strip() if verdicts else f"{state} (no verdict line in its log)"


def _detect_a_difference(settings: Settings, api) -> bool:
    """Change one committed amount in the warehouse by a cent, as a stray manual fix would; a
    reconciliation run of its batch with repair=true finds it, names the row and the column, writes
    the report, re-loads that key through BEGIN/END as a repair batch and reconciles again: the
    evidence keeps both verdicts."""
    import psycopg2

    from tidemark_workshop.settings import WAREHOUSE_DB

    name, table = "bank_ledger_entries", "batch.ledger_entries"
    dag_id = f"tidemark_reconcile_{name}"
    wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        with wh, wh.cursor() as cur:
            cur.execute("SELECT batch_id, window_lo ->> 'cursor' FROM tidemark_control.batches WHERE pipeline = %s "
                        "AND state = 'committed' AND repair_keys IS NULL ORDER BY committed_at DESC LIMIT 1", (name,))
            batch_id, lo = cur.fetchone()
            # a row of that batch's window (the catch-up run after the writers' batch carries the later rows)
            cur.execute(f"UPDATE {table} SET amount = amount + 0.01 WHERE entry_id = (SELECT entry_id FROM {table} "
                        "WHERE created_at > %s::timestamptz ORDER BY entry_id OFFSET 41 LIMIT 1) RETURNING entry_id",
                        (lo,))
            entry = cur.fetchone()[0]
        print(f"\ncorrupting one row on purpose: {table} entry {entry} amount + 0.01; reconciling batch {batch_id} "
              "again with repair=true (a manual run, as from the UI's Trigger form): the differing key is re-loaded "
              f"as a repair batch by tidemark_batch_{name} through BEGIN/END (the watermark stays), then it reconciles "
              "again ...", flush=True)
        run_id = api.trigger(dag_id, {"batch_id": batch_id, "scope": "batch", "repair": True})
        again, after = _reconciliation(api, dag_id, run_id, task_id="reconcile_again")
        _, before = _reconciliation(api, dag_id, run_id)
        print(f"  {dag_id} reconcile: {before}")
        detected = "1 rows differ: 1 amount changed" in before
        with wh, wh.cursor() as cur:
            cur.execute("SELECT batch_id, state, rows FROM tidemark_control.batches WHERE repair_of = %s "
                        "ORDER BY planned_at DESC LIMIT 1", (batch_id,))
            repaired = cur.fetchone()
        if repaired:
            print(f"  repair batch {repaired[0]}: {repaired[1]}, rows={repaired[2]}")
        print(f"  {dag_id} reconcile_again: {after}")
        with wh, wh.cursor() as cur:
            cur.execute("SELECT count(DISTINCT run_id), count(*) FILTER (WHERE verdict = 'fail') FROM "
                        "tidemark_control.reconciliation_results WHERE batch_id = %s", (batch_id,))
            runs, failures = cur.fetchone()
        print(f"  evidence for batch {batch_id}: {runs} reconciliation runs, {failures} failed checks kept "
              "(tidemark_control.reconciliation_results refuses UPDATE and DELETE)")
        return detected and again
    finally:
        wh.close()


def _prove(settings: Settings) -> list[str]:
    """Per pipeline, with the writers stopped: the target holds exactly what the watermark promises.

    Every source row at or below the watermark is in the target with the same cursor value;
    every target row exists in the source with that cursor value or a newer one (an upsert table
    has older versions of rows changed after the watermark); append-only targets hold exactly
    the source rows up to the watermark.
    """
    import psycopg2

    from tidemark.ledger import committed_watermark
    from tidemark.protocol.spec import load_spec, quote
    from tidemark_workshop.settings import REPO_ROOT, WAREHOUSE_DB

    def keyed(conn, spec, table):
        cols = ", ".join(quote(c) for c in (*spec.primary_key, spec.cursor.column))
        with conn, conn.cursor() as cur:
            cur.execute(f"SELECT {cols} FROM {quote(table)}")
            return {tuple(r[:-1]): r[-1] for r in cur.fetchall()}

    lines = []
    src, wh = psycopg2.connect(settings.dsn(settings.source_db)), psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        for name in PIPELINES:
            spec = load_spec(REPO_ROOT / "include" / "pipelines" / f"{name}.yaml")
            with wh, wh.cursor() as cur:
                bound = committed_watermark(cur, name)
            if bound is None:
                lines.append(f"{name}: no watermark: MISMATCH")
                continue
            mark = bound.cursor
            source, target = keyed(src, spec, spec.table), keyed(wh, spec, spec.target_table)
            due = {k: v for k, v in source.items() if v <= mark}
            missing = [k for k, v in due.items() if target.get(k) != v]
            stray = [k for k, v in target.items() if k not in source or source[k] < v]
            wrong = missing or stray or (spec.write_mode == "append_window_replace" and len(target) != len(due))
            nothing = not due and source  # a proof over no row while the source has rows proves nothing
            lines.append(
                f"{name}: watermark {mark.isoformat()}: {len(due)} of {len(source)} source rows due and compared key "
                f"by key, {len(target)} target rows, {len(missing)} missing, {len(stray)} stray: "
                f"{'MISMATCH' if wrong or nothing else 'OK'}" + (" (compared none)" if nothing else "")
            )
    finally:
        src.close()
        wh.close()
    return lines


def _start_afresh(settings: Settings) -> None:
    """Every demo tells the same story from the first night: an empty core-banking source, and no
    target, ledger, offsets or topic of the demo pipelines (the benchmark also reuses the source)."""
    import psycopg2

    from tidemark.ledger import ensure_control_schema, forget_capture, forget_pipeline
    from tidemark.protocol.kafka_io import delete_topic
    from tidemark.protocol.spec import load_spec, quote
    from tidemark.realtime.cdc.groups import captures
    from tidemark_workshop import bank
    from tidemark_workshop.settings import REPO_ROOT, WAREHOUSE_DB
    from tidemark_workshop.stack.__main__ import stop_streams
    from tidemark_workshop.stack.cdcrun import grant, remove_capture

    stop_streams(settings)  # a standing sink of an earlier demo would apply into what is dropped now
    specs = [load_spec(REPO_ROOT / "include" / "pipelines" / f"{name}.yaml") for name in PIPELINES]
    src = psycopg2.connect(settings.dsn(settings.source_db))
    wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        with wh, wh.cursor() as cur:
            ensure_control_schema(cur)
            for spec in specs:
                realtime = spec.stream or spec.cdc
                if realtime is not None:  # its serving views read the tables dropped next
                    view = realtime.serving_view
                    cur.execute(f"DROP VIEW IF EXISTS {quote(view + '_freshness')}, {quote(view)}")
                cur.execute(f"DROP TABLE IF EXISTS {quote(spec.target_table)}")
                forget_pipeline(cur, spec.name)  # its handoff too: the supervisor creates no connector now
                delete_topic(settings.kafka_bootstrap, spec.topic)
                if realtime is not None:
                    cur.execute(f"DROP TABLE IF EXISTS {quote(realtime.target_table)}")
                if spec.stream is not None:
                    delete_topic(settings.kafka_bootstrap, spec.stream.topic)
            for capture in captures(specs):  # the capture group's stream position and members
                forget_capture(cur, capture.consumer, capture.name if capture.grouped else None)
        for capture in captures(specs):  # the connector, slot, publication and topics of an earlier demo
            remove_capture(settings, capture.lead)
        bank.reset(src)
        for capture in captures(specs):  # what the tables' owner runs once: publication, heartbeat, grants
            grant(settings, capture)
    finally:
        src.close()
        wh.close()


def _streams(settings: Settings, api) -> bool:
    """The standing sink under the supervisor: its status, then kill -9 and the supervisor's restart."""
    import os
    import signal

    import psycopg2

    from tidemark.streams.launch import LocalLauncher
    from tidemark_workshop.settings import WAREHOUSE_DB
    from tidemark_workshop.stack.__main__ import pipeline_lines

    name = "bank_ledger_entries"
    launcher = LocalLauncher(settings.state_dir / "streams")
    for line in pipeline_lines(settings):
        print(f"  {line}")
    before = launcher.status(name)
    if not before.alive:
        print(f"standing sink of {name}: not running: MISMATCH (see the tidemark_supervisor log)")
        return False

    def live_fence():
        wh = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
        try:
            with wh, wh.cursor() as cur:
                cur.execute("SELECT fence FROM tidemark_control.stream_heartbeats WHERE pipeline = %s "
                            "AND ended_at IS NULL AND heartbeat_at > clock_timestamp() - interval '10 s'", (name,))
                row = cur.fetchone()
                return row[0] if row else None
        finally:
            wh.close()

    fence = live_fence()
    t0 = time.monotonic()
    os.killpg(before.pid, signal.SIGKILL)
    print(f"\nkill -9 of the standing sink of {name} (pid {before.pid}, fence {fence}); the supervisor's next cycle "
          "restarts it ...", flush=True)
    try:
        api.wait_for("the restarted sink's heartbeat", lambda: (live_fence() or 0) > (fence or 0), timeout_s=240)
    except StackError as exc:
        print(f"  not restarted: {exc}: MISMATCH")
        return False
    print(f"  restarted (pid {launcher.status(name).pid}, fence {live_fence()}) {time.monotonic() - t0:.0f} s after "
          "the kill: OK")
    return True


def _events(settings: Settings, api, published: int) -> bool:
    """The real-time path, with the writers stopped: serving.ledger_entries (the batch target merged
    with the events applied since its watermark) equals the source, row for row; then a malformed
    event goes to the dead-letter topic with its reason, and the event after it still lands."""
    import json

    import psycopg2
    from confluent_kafka import Producer

    from tidemark.protocol.kafka_io import producer_config
    from tidemark.protocol.spec import DEAD_LETTER_TOPIC
    from tidemark_workshop.bank_traffic import EVENTS_TOPIC, entry_events
    from tidemark_workshop.settings import WAREHOUSE_DB
    from tidemark_workshop.stack.batchrun import dead_letters
    from tidemark_workshop.stack.batchrun import query as db_query

    columns = "entry_id, txn_id, account_id, business_date, amount, currency, side, created_at"

    def query(db: str, sql: str) -> list[tuple]:
        return db_query(settings, db, sql)

    def rows(db: str, table: str) -> dict:
        return {r[0]: r for r in query(db, f"SELECT {columns} FROM {table}")}

    source = rows(settings.source_db, "bank.ledger_entries")
    print(f"\nreal-time path: {published} payment events published to {EVENTS_TOPIC} while the writers ran")
    try:
        api.wait_for("serving.ledger_entries to equal the source",
                     lambda: rows(WAREHOUSE_DB, "serving.ledger_entries") == source, timeout_s=180)
        ok = True
    except StackError:
        ok = False
    view = rows(WAREHOUSE_DB, "serving.ledger_entries")
    live = query(WAREHOUSE_DB, "SELECT count(*) FROM realtime.ledger_entries")[0][0]
    mark, stream_mark, complete = query(WAREHOUSE_DB, "SELECT batch_watermark, stream_watermark, complete_up_to "
                                                      "FROM serving.ledger_entries_freshness")[0]
    missing = [k for k in source if view.get(k) != source[k]]
    stray = [k for k in view if k not in source]
    print(f"  serving.ledger_entries: {len(view)} rows = batch.ledger_entries up to the watermark {mark.isoformat()} "
          f"+ {live} real-time rows after it; against the source's {len(source)}: {len(missing)} missing or "
          f"different, {len(stray)} stray: {'OK' if ok else 'MISMATCH'}")
    print(f"  freshness: the events are complete up to {stream_mark.isoformat() if stream_mark else '-'}, the view "
          f"up to {complete.isoformat() if complete else '-'}")
    bad = b'{"entry_id": 1, "amount": "12.50"'  # cut short: not JSON
    src = psycopg2.connect(settings.dsn(settings.source_db))
    try:
        with src, src.cursor() as cur:  # then a good event: the newest entry's, under a new entry id
            key, value = entry_events(cur, [max(source)])[0]
    finally:
        src.close()
    # stamped now: after the last batch's watermark (the catch-up run covers every entry the writers made)
    now = query(WAREHOUSE_DB, "SELECT to_json(clock_timestamp())::text")[0][0].strip('"')
    good = json.dumps({**json.loads(value), "entry_id": 10**15, "created_at": now}).encode()
    producer = Producer(producer_config(settings.kafka_bootstrap))
    producer.produce(EVENTS_TOPIC, value=bad, key=b"1")
    producer.produce(EVENTS_TOPIC, value=good, key=key)
    producer.flush(30)
    try:
        letter = api.wait_for("the dead letter", lambda: [d for d in dead_letters(
            settings.kafka_bootstrap, EVENTS_TOPIC, DEAD_LETTER_TOPIC) if d["value"] == bad], timeout_s=120)[0]
        api.wait_for("the event after it", lambda: query(
            WAREHOUSE_DB, "SELECT 1 FROM realtime.ledger_entries WHERE entry_id = 1000000000000000"), timeout_s=60)
    except StackError as exc:
        print(f"  a malformed event: {exc}: MISMATCH")
        return False
    print(f"  a malformed event went to {DEAD_LETTER_TOPIC}: {letter['tidemark.reason'].decode()}; the event after "
          "it applied: OK")
    return ok


def _changes(settings: Settings, api, closed_in_error: int) -> bool:
    """Change data capture of bank.accounts: its nightly run was the handoff (the table loaded in the
    snapshot its replication slot exported, while the writers ran); Debezium streams every change
    after it. An update and a delete made at the source reach serving.accounts in seconds, a kill -9
    of the Connect worker loses and repeats nothing, and the view ends equal to the source."""
    import os
    import signal

    import psycopg2

    from tidemark.ledger import committed_handoff
    from tidemark.protocol.spec import load_spec
    from tidemark.realtime.cdc.connect import ConnectClient
    from tidemark.realtime.cdc.groups import connector_name
    from tidemark_workshop.settings import REPO_ROOT, WAREHOUSE_DB
    from tidemark_workshop.stack.batchrun import query as db_query
    from tidemark_workshop.stack.cdcrun import read_slot
    from tidemark_workshop.stack.connect import Connect

    spec = load_spec(REPO_ROOT / "include" / "pipelines" / "bank_accounts.yaml")
    view, columns = spec.cdc.serving_view, "account_id, customer_id, currency, status, opened_at, updated_at"

    def query(db: str, sql: str, args=None) -> list[tuple]:
        return db_query(settings, db, sql, args)

    conn = psycopg2.connect(settings.dsn(WAREHOUSE_DB))
    try:
        with conn, conn.cursor() as cur:
            handoff = committed_handoff(cur, spec.name)
    finally:
        conn.close()
    if handoff is None:
        print(f"\nchange data capture of {spec.table}: no committed handoff batch: MISMATCH")
        return False
    print(f"\nchange data capture of {spec.table}: its nightly run was the handoff batch {handoff.batch_id}, read in "
          f"the snapshot of slot {handoff.slot} at {handoff.consistent_point} while the writers ran; Debezium streams every "
          "change after it. Waiting for the supervisor to create the connector on that slot ...", flush=True)
    client = ConnectClient(settings.connect_url)
    try:
        api.wait_for("the connector reading its slot", lambda: client.state(connector_name(spec)).running and (
            (held := read_slot(settings, spec)) is not None and held.active), timeout_s=300)
        frozen = query(settings.source_db, "UPDATE bank.accounts SET status = 'frozen', updated_at = now() WHERE "
                       "account_id = (SELECT min(account_id) FROM bank.accounts WHERE status = 'open') "
                       "RETURNING account_id")[0][0]
        query(settings.source_db, "DELETE FROM bank.accounts WHERE account_id = %s", (closed_in_error,))
        t0 = time.monotonic()
        api.wait_for("the update and the delete in the serving view", lambda: query(
            WAREHOUSE_DB, f"SELECT account_id, status FROM {view} WHERE account_id IN (%s, %s)",
            (frozen, closed_in_error)) == [(frozen, "frozen")], timeout_s=120, every_s=0.2)
        print(f"  account {frozen} frozen and account {closed_in_error} (opened in error) deleted at the source: "
              f"both in {view} {time.monotonic() - t0:.1f} s later: OK")

        worker = Connect(settings)
        pid = worker.worker_pid()
        if pid is None:
            raise StackError("the Connect worker's JVM was not found: is it running (make status)?")
        os.kill(pid, signal.SIGKILL)
        api.wait_for("the Connect worker gone", lambda: worker.worker_pid() != pid and not worker.answers(),
                     timeout_s=30)
        reopened = query(settings.source_db, "UPDATE bank.accounts SET status = 'open', updated_at = now() WHERE "
                         "account_id = %s RETURNING account_id", (frozen,))[0][0]
        print(f"  kill -9 of the Connect worker's JVM (pid {pid}); account {reopened} unfrozen while it is down; "
              "the stack's keeper starts the worker again by itself, as compose's restart policy does ...", flush=True)
        t0 = time.monotonic()
        api.wait_for("the Connect worker started again by its keeper", worker.answers, timeout_s=300)
        print(f"  the worker answers again {time.monotonic() - t0:.0f} s after the kill (pid {worker.worker_pid()})",
              flush=True)
        api.wait_for("the unfreeze in the serving view", lambda: query(
            WAREHOUSE_DB, f"SELECT status FROM {view} WHERE account_id = %s", (reopened,)) == [("open",)],
            timeout_s=240)
        print(f"  Debezium went on from the offsets it had stored: the unfreeze in {view} "
              f"{time.monotonic() - t0:.0f} s after the kill: OK")
    except StackError as exc:
        print(f"  {exc}: MISMATCH (the supervisor's log: tidemark_supervisor; the worker's: make logs connect)")
        return False
    same = True
    # the group's other member: every posting's balance, applied with the rest of its source transaction
    balances = load_spec(REPO_ROOT / "include" / "pipelines" / "bank_daily_balances.yaml")
    for member, member_columns, order in ((spec, columns, "account_id"), (
            balances, "account_id, business_date, opening, movements, closing, currency", "account_id, business_date")):
        member_view = member.cdc.serving_view
        source = query(settings.source_db, f"SELECT {member_columns} FROM {member.table} ORDER BY {order}")
        try:
            api.wait_for(f"{member_view} equal to the source", lambda: set(query(
                WAREHOUSE_DB, f"SELECT {member_columns} FROM {member_view}")) == set(source), timeout_s=120)
        except StackError:
            pass  # the count below says how far apart they are
        served = query(WAREHOUSE_DB, f"SELECT {member_columns} FROM {member_view} ORDER BY {order}")
        differ = len(set(source) ^ set(served))
        ok = differ == 0 and len(source) > 0  # a proof over no row proves nothing
        print(f"  {member_view}: {len(served)} rows against the source's {len(source)}, {differ} missing, stray or "
              f"different (capture group {member.cdc.group}): {'OK' if ok else 'MISMATCH'}")
        same = same and ok
    return same


def main() -> int:
    import psycopg2

    from tidemark_workshop import bank, bank_traffic

    settings = Settings.from_env()
    dsn = settings.dsn(settings.source_db)
    _start_afresh(settings)
    conn = psycopg2.connect(dsn)
    seeded = bank.seed(conn)
    bank_traffic.post_transfers(conn, 200, rng=__import__("random").Random(1))
    with conn, conn.cursor() as cur:  # closed at once, no entries: the change capture deletes it later
        cur.execute("INSERT INTO bank.accounts (customer_id, currency, status, opened_at) "
                    "VALUES (1, 'EUR', 'closed', now()) RETURNING account_id")
        closed_in_error = cur.fetchone()[0]
    conn.close()
    print(f"source: core-banking schema seeded ({seeded}); 3 concurrent writers start now, and one "
          "transaction stays open for 20 s (longer than the 2 s safe lag)", flush=True)
    failed: list[str] = []  # the steps whose proof failed, named on the last line

    def step(name: str, passed: bool) -> bool:
        if not passed:
            failed.append(name)
        return passed

    ok = True
    ui = AirflowUI(settings)
    ui.start()
    ui.wait_healthy()
    api = RestApi(ui.url)
    # bank_ledger_entries has a standing sink: the supervisor starts it, its nightly run waits for it
    api.wait_for("tidemark_supervisor to be parsed", lambda: api.exists("tidemark_supervisor"), timeout_s=180)
    api.call("PATCH", "/dags/tidemark_supervisor", {"is_paused": False})
    with bank_traffic.Simulator(dsn, writers=3, pause=0.2, events=settings.kafka_bootstrap) as sim:
        held = bank_traffic.hold_open(dsn, 20, rows=10)
        for name in PIPELINES:
            ok &= step(f"the nightly run of {name} under the writers", _run_pipeline(settings, api, name))
        conn = psycopg2.connect(dsn)
        try:  # its application publishes its events once it commits, as the writers do
            held_events = bank_traffic.publish_events(conn, settings.kafka_bootstrap, held.wait())
        finally:
            conn.close()
    print(f"\nwriters: {sim.stats}")
    print("\nthe writers stopped: one more run of each nightly DAG (Trigger, as a person clicks it), so every row "
          "written so far is due and each reconciliation compares rows", flush=True)
    for name in PIPELINES:
        ok &= step(f"the quiet run of {name}", _run_pipeline(settings, api, name, quiet=True))
    for line in _prove(settings):
        ok &= step(f"the proof '{line.split(':')[0].strip()}'", line.endswith(": OK"))
        print(line)
    ok &= step("a difference detected and repaired", _detect_a_difference(settings, api))
    ok &= step("the events stream", _events(settings, api, sim.stats["events"] + held_events))
    ok &= step("change data capture (and the Connect worker's kill -9)", _changes(settings, api, closed_in_error))
    print("\nper pipeline (make status):")
    ok &= step("the standing sinks' status", _streams(settings, api))
    print(f"\nThe Airflow UI is running at {ui.url} (runs, task logs; Tidemark status at {ui.url}/tidemark/), "
          "and the supervisor keeps the standing sink running; `make down` stops both")
    if not ok:
        print(f"demo FAILED at {len(failed)} step(s): {'; '.join(failed)}. Each one's MISMATCH line above says what "
              f"it compared or waited for. Next: `make status` and the runs' task logs in the Airflow UI ({ui.url}), "
              "then `make demo` again (it starts afresh)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
