"""The local cluster (`cqrs dev up --cluster`) for tests: started if it is not running (and
stopped again afterwards if so), a configuration with the test's own topics, keyspace and
checkpoints, and `cqrs run ...` jobs on it as process groups.

Used by ``tests/reliability/on_cluster`` (the bank on the cluster and the fault suite, one
set of jobs), whose conftest starts the cluster once (:func:`cluster_up`); a module has names
of its own on it (:func:`fresh_names`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs

from cqrs.config import CqrsConfig, load_config
from cqrs.devstack import artifacts
from cqrs.devstack.cluster import cluster_toml_path
from cqrs.devstack.stack import DevStack

__all__ = ["WAIT", "Cluster", "cluster_up", "down_in_background", "eventually", "fresh_names",
           "job_report", "running_cluster", "spark_apps", "start_job"]

WAIT = 150.0
T = TypeVar("T")


@attrs.frozen
class Cluster:
    base: CqrsConfig  # the configuration the cluster's processes were started with
    cfg: CqrsConfig  # the framework on the cluster, under this test's names
    env: dict[str, str]  # the same for `cqrs` processes (CQRS_CONFIG and CQRS_* variables)
    logs: Path

    def stack(self) -> DevStack:
        return DevStack(self.base, cluster=True)


@contextmanager
def cluster_up() -> Iterator[CqrsConfig]:
    """The cluster, up and healthy (started if it is not running); the configuration its
    processes were started with. Brought down afterwards unless it was running before (the
    services stop in the background; the session waits for them before it exits)."""
    base = load_config()
    if not all(artifacts.is_installed(base.dev, c) for c in artifacts.COMPONENTS):
        artifacts.install(base.dev)
    stack = DevStack(base, cluster=True)
    already = any(s.running for s in stack.status())
    started = time.monotonic()
    statuses = stack.up(say=lambda m: None)
    took = time.monotonic() - started
    assert all(s.healthy for s in statuses), statuses
    print(f"cluster up in {took:.1f} s; resident MiB: "
          + ", ".join(f"{s.name} {s.resident_mib:.0f}" for s in statuses if s.resident_mib))
    try:
        yield base
    finally:
        if not already:
            down_in_background(stack, "cluster")


def down_in_background(stack: DevStack, label: str) -> None:
    """``stack.down()`` while the next tests run: a broker's and a Cassandra node's clean stop
    take seconds (~11 s the cluster's) that no test needs to wait for. In a thread that is no
    daemon: the interpreter waits for it before it exits, so a session never ends with the
    services still running."""
    def down() -> None:
        started = time.monotonic()
        stack.down(say=lambda m: print(f"  {time.monotonic() - started:5.1f} s {m}", flush=True))
        print(f"{label} down in {time.monotonic() - started:.1f} s", flush=True)

    threading.Thread(target=down, name=f"{label}-down").start()


def fresh_names(base: CqrsConfig, tmp: Path, name: str = "cluster",
                idle_timeout: float = 60.0) -> Cluster:
    """The running cluster under a fresh topic prefix, keyspace and checkpoint folder (under
    ``tmp``, with the jobs' logs), once the Spark master runs no application any more.

    The two workers offer four cores and each job's application takes two (processor and
    projector fill the cluster): a job a previous test stopped a moment ago may still hold its
    cores, and the next test's application would wait for them."""
    left = eventually(lambda: not spark_apps(base), idle_timeout)
    if not left:
        print(f"the Spark master still runs {spark_apps(base)} "
              f"after {idle_timeout:.0f} s")
    tag = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "CQRS_CONFIG": str(cluster_toml_path(base)),  # the file `cqrs dev up --cluster` wrote
        "CQRS_KAFKA_TOPIC_PREFIX": f"t-{name}-{tag}-",
        "CQRS_CASSANDRA_KEYSPACE": f"t_{name.replace('-', '_')}_{tag}",
        "CQRS_SPARK_CHECKPOINT_DIR": str(tmp / "checkpoints"),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    return Cluster(base, load_config(env=env), env, tmp)


@contextmanager
def running_cluster(tmp: Path, name: str = "cluster") -> Iterator[Cluster]:
    """The cluster, up and healthy, with a fresh topic prefix, keyspace and checkpoint folder
    under ``tmp``; brought down afterwards unless it was running before."""
    with cluster_up() as base:
        yield fresh_names(base, tmp, name)


def spark_apps(cfg: CqrsConfig, states: bool = False) -> dict[str, Any]:
    """The applications on the cluster's standalone master (``activeapps``: running and
    waiting ones; ``cfg``: any configuration with the cluster's ``dev`` settings): name -> cores they hold, or with ``states`` name -> "STATE, n cores"."""
    import json
    import urllib.request

    from cqrs.devstack.cluster import spark_master_url

    port = int(spark_master_url(cfg).rsplit(":", 1)[1]) + 1000
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=5) as reply:  # noqa: S310
        apps = json.loads(reply.read())["activeapps"]
    if states:
        return {a["name"]: f"{a['state']}, {a['cores']} cores" for a in apps}
    return {a["name"]: a["cores"] for a in apps}


def job_report(cluster: Cluster, proc: subprocess.Popen[bytes], log: str, lines: int = 30) -> str:
    """For a failure message: whether the job still runs (or its exit status) and the last
    lines of its log."""
    code = proc.poll()
    state = "still running" if code is None else f"exited with status {code}"
    try:
        text = (cluster.logs / f"{log}.log").read_text(errors="replace")
    except FileNotFoundError:
        text = "(no log)"
    tail = "".join(text.splitlines(True)[-lines:])
    return f"\n--- {log} (pid {proc.pid}) {state}; the end of its log:\n{tail}"


def start_job(cluster: Cluster, *argv: str, log: str | None = None) -> subprocess.Popen[bytes]:
    """``cqrs <argv>`` in its own process group (stop it with ``process_group.stop``), its
    output appended to ``<logs>/<log or argv[1]>.log``."""
    with (cluster.logs / f"{log or argv[1]}.log").open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", *argv], env=cluster.env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def eventually(check: Callable[[], T], timeout: float = WAIT, every: float = 1.0) -> T:
    """``check()`` until it returns something true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every)

