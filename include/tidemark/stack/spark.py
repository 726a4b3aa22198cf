"""Spark in local mode: the connector jars it needs, resolved ahead of any job."""

from __future__ import annotations

from pathlib import Path

from tidemark.settings import REPO_ROOT, Settings
from tidemark.stack.maven import artifact_name, resolve
from tidemark.stack.proc import StackError, say

POM = REPO_ROOT / "stack" / "spark" / "pom.xml"


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def prepare(settings: Settings) -> list[Path]:
    shipped = frozenset(artifact_name(p.name) for p in pyspark_jars_dir().glob("*.jar"))
    jars = resolve(POM, settings.spark_jars_dir, skip_names=shipped)
    names = " ".join(j.name for j in jars)
    for needed in ("spark-sql-kafka-0-10", "postgresql-"):
        if needed not in names:
            raise StackError(f"Spark connector jar {needed}* missing from {settings.spark_jars_dir}")
    return jars


def status(settings: Settings) -> str:
    jars = settings.spark_jars()
    state = "ready" if jars else "missing"
    return f"spark     {state:8} master={settings.spark_master}  jars={len(jars)} in {settings.spark_jars_dir}"


def describe(settings: Settings) -> None:
    say("spark", f"local mode {settings.spark_master}, {len(settings.spark_jars())} connector jars ready")
