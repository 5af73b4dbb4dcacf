"""``nodetool`` against the dev stack's Cassandra node, over its local-only JMX port
(``[dev] cassandra_jmx_port``): the benches flush the node's memtables and wait for its
compactions before a timed run, so that what an earlier run (or the warm-up) wrote is not
flushed and compacted inside the window of whichever run comes next."""

from __future__ import annotations

import re
import subprocess
import time

from cqrs.config import CqrsConfig
from cqrs.devstack.artifacts import require_installed
from cqrs.devstack.services import CASSANDRA_JDK17_FLAGS, cassandra_node, find_java
from cqrs.errors import DevStackError

__all__ = ["compactions_pending", "flush_and_compact", "nodetool"]

_VANISHED = "Server is not initialized yet"
_VANISHED_RETRIES = 3


def nodetool(cfg: CqrsConfig, *args: str, timeout_s: float = 120.0) -> str:
    """What ``nodetool <args>`` printed, run against the local node (a JVM of its own, ~1-2 s),
    or :class:`DevStackError` with its output."""
    port = cfg.dev.cassandra_jmx_port
    if not port:
        raise DevStackError(
            "nodetool needs the local Cassandra node's JMX port, and [dev] cassandra_jmx_port "
            "is 0: set it (default 17199) and restart the stack (`cqrs dev down && cqrs dev up`)"
        )
    jars = require_installed(cfg.dev, "cassandra")
    logback = cassandra_node(cfg).workdir / "logback.xml"  # the node's: warnings only
    argv = [find_java(cfg), "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            *CASSANDRA_JDK17_FLAGS, f"-Dlogback.configurationFile={logback}",
            "-cp", str(jars / "*"), "org.apache.cassandra.tools.NodeTool",
            "-h", "127.0.0.1", "-p", str(port), *args]
    deadline = time.monotonic() + timeout_s
    for attempt in range(_VANISHED_RETRIES + 1):
        try:
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise DevStackError(
                f"nodetool {' '.join(args)} did not finish within {timeout_s:.0f} s") from None
        # nodetool prints this for any InstanceNotFoundException, also for the MBean of a table
        # dropped (by another client) between listing the tables and reading one: run it again.
        if done.returncode == 0 or _VANISHED not in done.stderr + done.stdout:
            break
        if attempt < _VANISHED_RETRIES:
            time.sleep(1.0)
    if done.returncode != 0:
        raise DevStackError(
            f"nodetool {' '.join(args)} failed ({done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-800:]} (is the stack up, with its JMX port "
            f"{port}? a stack started before JMX was configured needs `cqrs dev down && "
            "cqrs dev up`)"
        )
    return done.stdout


def compactions_pending(cfg: CqrsConfig) -> int:
    """Compactions the node has pending or running (``nodetool compactionstats``)."""
    out = nodetool(cfg, "compactionstats")
    found = re.search(r"pending tasks:?\s+(\d+)", out)
    if found is None:
        raise DevStackError(f"nodetool compactionstats printed no pending count: {out[:400]!r}")
    running = sum(1 for line in out.splitlines() if re.match(r"\s*[0-9a-f]{8}-[0-9a-f]{4}-", line))
    return int(found.group(1)) + running


def flush_and_compact(cfg: CqrsConfig, timeout_s: float = 120.0) -> float:
    """Flush every memtable of the node and wait until no compaction is pending or running
    (twice in a row: a flush's compactions are planned just after it; at most ``timeout_s``);
    the seconds it took."""
    started = time.monotonic()
    nodetool(cfg, "flush", timeout_s=timeout_s)
    quiet = 0
    while quiet < 2 and time.monotonic() - started < timeout_s:
        quiet = 0 if compactions_pending(cfg) else quiet + 1  # each call takes ~1 s
    return time.monotonic() - started
