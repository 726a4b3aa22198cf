"""`make demo`: run the demo DAGs through Airflow and print a short human summary.

Each step prints one summary line (tidemark.summary); this module collects those lines from
the `airflow dags test` output, which is kept in full in the state directory's logs/demo.log.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

from tidemark.settings import Settings
from tidemark.summary import parse_summaries

DEMO_DAGS = ("tidemark_smoke",)


def run_dag(dag_id: str, settings: Settings) -> tuple[str, float, list[dict]]:
    log = settings.logs_dir / "demo.log"
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


def main() -> int:
    settings = Settings.from_env()
    ok = True
    for dag_id in DEMO_DAGS:
        print(f"running {dag_id} through Airflow (airflow dags test) ...", flush=True)
        state, seconds, steps = run_dag(dag_id, settings)
        ok &= state == "success"
        print(f"\n{dag_id}: {state} in {seconds:.1f}s")
        for step in steps:
            name = step.pop("step")
            print(f"  {name:<12} " + ", ".join(f"{k}={v}" for k, v in step.items()))
    print(f"\nfull log: {settings.logs_dir / 'demo.log'}")
    print(f"Airflow UI: `make ui`, then http://127.0.0.1:{settings.airflow_port}")
    if not ok:
        print("demo FAILED: read the log above for the failing task and its message", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
