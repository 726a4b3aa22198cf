"""Maven for the stack: jars resolved from Maven Central once (a stamp records which pom produced them), and
Tidemark's own Java built (stack/java), again only when its sources change."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from tidemark_workshop.settings import REPO_ROOT
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


# Tidemark's own Java (stack/java, one Maven build): each module's jar as the stack names it.
JAVA = REPO_ROOT / "stack" / "java"
JARS = {"udf": "tidemark-udf.jar", "signing": "tidemark-signing.jar"}


def build_java(state_dir: Path) -> dict[str, Path]:
    """Tidemark's jars (stack/java: the Spark UDFs and the direct COPY, the Connect converter that signs
    change records), built with Maven into ``state_dir/java`` by module name; again only when a pom or a
    source under stack/java changed (a stamp there holds their digest). Maven's own build directories
    (stack/java/*/target) are its working space; the tests are ``make java-test``'s."""
    files = sorted(f for f in [JAVA / "pom.xml", *JAVA.glob("*/pom.xml"), *JAVA.glob("*/src/**/*")] if f.is_file())
    digest = hashlib.sha256(b"".join(str(f.relative_to(JAVA)).encode() + b"\0" + f.read_bytes()
                                     for f in files)).hexdigest()
    out = state_dir / "java"
    jars = {module: out / name for module, name in JARS.items()}
    stamp = out / ".built"
    if stamp.exists() and stamp.read_text() == digest and all(j.exists() for j in jars.values()):
        return jars
    say("maven", f"building {', '.join(JARS.values())} (stack/java)")
    run(["mvn", "-q", "-B", "-f", str(JAVA / "pom.xml"), "package", "-DskipTests"], what="mvn package (stack/java)")
    out.mkdir(parents=True, exist_ok=True)
    for module, jar in jars.items():
        shutil.copyfile(JAVA / module / "target" / jar.name, jar)
    stamp.write_text(digest)
    return jars


def install(jar: Path, target: Path) -> Path:
    """``jar`` copied to ``target`` unless the same bytes are there already (the jars are reproducible:
    a rebuild of the same sources leaves ``target`` untouched, and a running JVM need not restart)."""
    if not target.exists() or target.read_bytes() != jar.read_bytes():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(jar, target)
    return target
