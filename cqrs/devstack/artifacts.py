"""The Maven artifacts of the dev stack: resolved once by ``cqrs dev install``, then only read.

Versions live in ``pom.xml`` beside this file and nowhere else. Each component (kafka,
cassandra, spark) is copied with its dependencies into its own folder of the cache, named after
its version, so upgrading a version in the pom installs next to the old one.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from cqrs.config import DevSettings
from cqrs.errors import DevStackError

__all__ = ["COMPONENTS", "POM", "component_dir", "install", "is_installed", "pinned_versions"]

POM = Path(__file__).with_name("pom.xml")
COMPONENTS = ("kafka", "cassandra", "spark")
_VERSION_PROPERTY = {"kafka": "kafka.version", "cassandra": "cassandra.version", "spark": "spark.version"}
_DONE_MARKER = ".complete"


def pinned_versions() -> dict[str, str]:
    """The component versions pinned in the pom: ``{"kafka": "4.3.1", ...}``."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(POM).getroot().find("m:properties", ns)
    if props is None:
        raise DevStackError(f"{POM} has no <properties>; the dev stack pom is damaged")
    versions = {}
    for component, prop in _VERSION_PROPERTY.items():
        node = props.find(f"m:{prop}", ns)
        if node is None or not (node.text or "").strip():
            raise DevStackError(f"{POM} does not pin <{prop}>")
        versions[component] = node.text.strip()  # type: ignore[union-attr]
    return versions


def component_dir(dev: DevSettings, component: str) -> Path:
    """The folder holding ``component``'s jars, e.g. ``~/.cache/cqrs/artifacts/kafka-4.3.1``."""
    if component not in COMPONENTS:
        raise DevStackError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")
    return dev.artifacts_path / f"{component}-{pinned_versions()[component]}"


def is_installed(dev: DevSettings, component: str) -> bool:
    return (component_dir(dev, component) / _DONE_MARKER).is_file()


def require_installed(dev: DevSettings, component: str) -> Path:
    """The jar folder of ``component``, or a clear error telling how to install it."""
    if not is_installed(dev, component):
        raise DevStackError(
            f"{component} {pinned_versions()[component]} is not installed in "
            f"{component_dir(dev, component)}; run `cqrs dev install` first"
        )
    return component_dir(dev, component)


def install(
    dev: DevSettings,
    components: tuple[str, ...] = COMPONENTS,
    say: Callable[[str], None] = print,
) -> dict[str, Path]:
    """Resolve the components with Maven into the cache; those already there are skipped."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevStackError(
            "Maven (`mvn`) is not on PATH; install it (e.g. `apt-get install maven`) and retry"
        )
    done: dict[str, Path] = {}
    for component in components:
        target = component_dir(dev, component)
        if is_installed(dev, component):
            say(f"{component}: already installed in {target}")
            done[component] = target
            continue
        if target.exists():
            shutil.rmtree(target)  # a half-finished earlier install
        target.mkdir(parents=True)
        say(f"{component}: resolving {pinned_versions()[component]} with Maven into {target} ...")
        started = time.monotonic()
        log = target / "mvn.log"
        with log.open("w") as out:
            rc = subprocess.call(
                [mvn, "-B", "-q", "-f", str(POM), "-P", component,
                 "dependency:copy-dependencies", f"-DoutputDirectory={target}"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )
        if rc != 0:
            tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
            raise DevStackError(
                f"Maven failed (exit {rc}) resolving {component}; full log: {log}\n{tail}"
            )
        (target / _DONE_MARKER).write_text(pinned_versions()[component])
        jars = len(list(target.glob("*.jar")))
        say(f"{component}: {jars} jars in {time.monotonic() - started:.0f} s")
        done[component] = target
    return done
