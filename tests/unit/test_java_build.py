"""Tidemark's Java (stack/java, one Maven build; its JUnit tests are `make java-test`): what the Python
side relies on, checked without Maven: the versions it compiles against are those the stack runs, and each
module makes the jar the stack installs."""

from __future__ import annotations

import xml.etree.ElementTree as ET

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
