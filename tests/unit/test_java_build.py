"""Tidemark's Java (stack/java, one Maven build; its JUnit tests are `make java-test`): what the Python
side relies on, checked without Maven: the versions it compiles against are those the stack runs, each
module makes the jar the stack installs, and the refusal's class the extract looks for is the one thrown."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from tidemark.batch.extract.direct import refusal
from tidemark.batch.stage import STAGE_REFUSED_CLASS
from tidemark_workshop.settings import REPO_ROOT
from tidemark_workshop.stack.maven import JARS, JAVA

NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _properties(pom: str) -> dict[str, str]:
    root = ET.parse(REPO_ROOT / pom).getroot()
    return {p.tag.split("}")[1]: p.text for p in root.find("m:properties", NS)}


def test_the_java_build_compiles_against_the_versions_the_stack_runs():
    java = _properties("stack/java/pom.xml")
    spark = _properties("stack/spark/pom.xml")
    assert (java["spark.version"], java["postgresql.version"]) == (spark["spark.version"], spark["postgresql.version"])
    assert java["kafka.version"] == _properties("stack/connect/pom.xml")["kafka.version"]
    assert java["kafka.version"] == _properties("stack/kafka/pom.xml")["kafka.version"]
    worker = ET.parse(REPO_ROOT / "stack/connect/pom.xml").getroot()
    slf4j = [d.find("m:version", NS).text for d in worker.iterfind("m:dependencies/m:dependency", NS)
             if d.find("m:artifactId", NS).text == "slf4j-api"]
    assert slf4j == [java["slf4j.version"]]
    assert java["maven.compiler.release"] == "17"


def test_each_module_builds_the_jar_the_stack_installs():
    modules = [m.text for m in ET.parse(JAVA / "pom.xml").getroot().find("m:modules", NS)]
    assert sorted(modules) == sorted(JARS)
    for module, jar in JARS.items():
        root = ET.parse(JAVA / module / "pom.xml").getroot()
        assert f"{root.find('m:artifactId', NS).text}.jar" == jar
        assert root.find("m:build/m:finalName", NS).text == "${project.artifactId}"


def test_the_refusal_class_the_extract_looks_for_is_the_one_directcopy_throws():
    source = JAVA / "udf" / "src" / "main" / "java" / (STAGE_REFUSED_CLASS.replace(".", "/") + ".java")
    assert re.search(r"public final class StageRefused extends RuntimeException", source.read_text())
    direct_copy = (JAVA / "udf" / "src" / "main" / "java" / "tidemark" / "DirectCopy.java").read_text()
    assert "new StageRefused(" in direct_copy


def test_a_refusal_is_read_from_the_spark_error_after_the_class_name():
    error = ("An error occurred while calling z:tidemark.DirectCopy.stage.\n"
             ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 2.0 failed 1 times, "
             "most recent failure: Lost task 0.0 in stage 2.0 (TID 2) (10.0.0.5 executor driver): "
             "tidemark.StageRefused: the typed stage refused one of 300 rows of batch b-1 attempt 1: ERROR: value too "
             "long for type character(3)\n\tat tidemark.DirectCopy$Task.copy(DirectCopy.java:321)\n"
             "Caused by: tidemark.StageRefused: the typed stage refused one of 300 rows of batch b-1 attempt 1: again")
    assert refusal(error) == ("the typed stage refused one of 300 rows of batch b-1 attempt 1: ERROR: value too long "
                              "for type character(3)")
    assert refusal("java.lang.RuntimeException: the typed stage refused one of 3 rows") is None  # not the type
    assert refusal("org.postgresql.util.PSQLException: ERROR: connection lost") is None
