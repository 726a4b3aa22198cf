"""Resolve jars from Maven Central with Maven, once: a stamp records which pom produced them."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from tidemark_workshop.stack.proc import run, say


def resolve(pom: Path, target: Path, *, skip_names: frozenset[str] = frozenset()) -> list[Path]:
    """Copy the pom's runtime dependencies into ``target`` unless they are already there.

    ``skip_names`` are artifact names (file names without version) to leave out: jars the
    runtime already ships in its own version, which must win over a second copy.
    Maven's own local repository (~/.m2) caches downloads across checkouts.
    """
    digest = hashlib.sha256(pom.read_bytes() + ",".join(sorted(skip_names)).encode()).hexdigest()
    stamp = target / ".resolved"
    if stamp.exists() and stamp.read_text() == digest:
        return sorted(target.glob("*.jar"))
    say("maven", f"resolving {pom.relative_to(pom.parents[2])} into {target}")
    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    run(
        ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
         f"-DoutputDirectory={staging}", "-DincludeScope=runtime"],
        what=f"mvn dependency:copy-dependencies ({pom})",
    )
    for jar in staging.glob("*.jar"):
        if artifact_name(jar.name) in skip_names:
            jar.unlink()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    stamp.write_text(digest)
    return sorted(target.glob("*.jar"))


def artifact_name(jar_file: str) -> str:
    """'scala-library-2.13.15.jar' -> 'scala-library'."""
    match = re.match(r"(.+?)-\d[^-]*(-.*)?\.jar$", jar_file)
    return match.group(1) if match else jar_file.removesuffix(".jar")


def compile_jar(sources: Path, classpath: str, jar: Path, work: Path, *, what: str) -> Path:
    """Compile the Java files under ``sources`` against ``classpath`` into ``jar``, with the other files
    there (``META-INF/services``, say) as they lie; again only when one changed (a stamp beside the jar
    holds their digest)."""
    files = sorted(f for f in sources.rglob("*") if f.is_file())
    digest = hashlib.sha256(b"".join(str(f.relative_to(sources)).encode() + f.read_bytes() for f in files)).hexdigest()
    stamp = jar.with_name(f".{jar.stem}-built")
    if jar.exists() and stamp.exists() and stamp.read_text() == digest:
        return jar
    shutil.rmtree(work, ignore_errors=True)
    jar.parent.mkdir(parents=True, exist_ok=True)
    run(["javac", "--release", "17", "-nowarn", "-cp", classpath, "-d", str(work),
         *(str(f) for f in files if f.suffix == ".java")], what=f"javac ({what})")
    for f in files:
        if f.suffix != ".java":
            (work / f.relative_to(sources)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, work / f.relative_to(sources))
    run(["jar", "cf", str(jar), "-C", str(work), "."], what=f"jar ({what})")
    stamp.write_text(digest)
    return jar
