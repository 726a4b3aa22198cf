"""What the source's owner runs for a CDC pipeline's capture, printed: ``python -m tidemark.realtime.cdc.grants <pipeline>``
(``make grants P=<pipeline>`` on the local stack).

The statements of ``tidemark.realtime.cdc.source.grant_sql`` for the pipeline's capture (its own, or its capture
group's, read from the specs beside it), ending with ``;`` so that they can be piped into ``psql``. They
can run again: a group's publication is set to the group's tables, so when a member joins, the owner runs
the same command once more. The replication role itself (once per source, by a superuser) is printed as a
comment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tidemark.protocol.config import pipelines_dir
from tidemark.protocol.spec import load_specs
from tidemark.realtime.cdc.groups import captures
from tidemark.realtime.cdc.source import grant_sql, role_sql


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", help="the CDC pipeline's name (its spec's name field)")
    parser.add_argument("--role", default="tidemark_cdc",
                        help="the replication role Debezium and the handoff log in as (the login of the Airflow "
                             "connection tidemark_cdc; default tidemark_cdc)")
    parser.add_argument("--pipelines", default=None, help="the specs' directory (default: TIDEMARK_PIPELINES_DIR)")
    args = parser.parse_args(argv)
    directory = Path(args.pipelines) if args.pipelines else pipelines_dir()
    loaded, errors = load_specs(directory)
    specs = [spec for _, spec in loaded]
    spec = next((s for s in specs if s.name == args.pipeline), None)
    if spec is None or spec.cdc is None:
        what = "no pipeline" if spec is None else "pipeline"
        print(f"grants: {what} {args.pipeline} {'in' if spec is None else 'has no cdc section in its spec in'} "
              f"{directory}" + (f" ({len(errors)} spec file(s) there do not load: make status names them)"
                                if errors else ""), file=sys.stderr)
        return 2
    capture = next(c for c in captures(specs) if any(m.name == spec.name for m in c.members))
    print(f"-- {capture.describe()}: run as the owner of its tables, on the source database")
    print(f"-- once per source, as a superuser, if the role does not exist: {role_sql(args.role)}")
    for statement in grant_sql(capture, args.role):
        print(f"{statement};")
    return 0


if __name__ == "__main__":
    sys.exit(main())
