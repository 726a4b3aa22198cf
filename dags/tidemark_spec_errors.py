"""
### Invalid Tidemark pipeline specs, as import errors

Parses every spec in `include/pipelines/` and, if any is invalid, fails to import with one line
per bad file naming the file and field. Airflow lists it under the UI's import errors (and
`airflow dags list-import-errors`), where people look for broken DAGs; the valid pipelines'
DAGs come from `tidemark_batch.py` and keep working. Defines no DAG.
"""

from __future__ import annotations

from tidemark.protocol.config import pipelines_dir
from tidemark.protocol.spec import SpecError, load_specs

_, _errors = load_specs(pipelines_dir())
if _errors:
    raise SpecError(
        f"{len(_errors)} invalid pipeline spec(s); their DAGs are not loaded until fixed:\n"
        + "\n".join(f"  {e}" for e in _errors)
    )
