"""Memory and start time of ``cqrs run app`` against ``cqrs run processor`` + ``cqrs run projector``.

    .venv/bin/python scripts/measure_run_app.py [domain_examples.bank:app] [--rounds 1]

Each round and mode gets fresh topics (a prefix), a fresh keyspace and fresh checkpoints, with
20 commands waiting in the commands topic before anything starts. Start time: from launching
the process(es) until every query has finished a micro-batch that had records (the processor's
with the commands, each projector's with their events). Memory: resident set of each launched
process and all its descendants (the driver JVM and Spark's Python workers), read from /proc
10 s after that, summed. Prints one Markdown row per round and mode, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from cqrs.config import CqrsConfig, load_config
from cqrs.ops.memory import tree_rss_bytes

SETTLE_S = 10.0
TIMEOUT_S = 600.0


def _prepare(cfg: CqrsConfig, app_ref: str) -> None:
    from cqrs.client import CommandClient
    from cqrs.loading import load_app
    from cqrs.topics import ensure_topics, topics_for
    from domain_examples.bank import OpenAccount

    app = load_app(app_ref)
    ensure_topics(cfg, topics_for(app.name, cfg.kafka.topic_prefix))
    with CommandClient(app, cfg) as client:
        for i in range(20):
            client.send(f"acc-{i}", OpenAccount(f"owner-{i}"), expected_version=0)
        client.flush()


def _env(cfg: CqrsConfig, port: int) -> dict[str, str]:
    return {**os.environ, "CQRS_KAFKA_TOPIC_PREFIX": cfg.kafka.topic_prefix,
            "CQRS_CASSANDRA_KEYSPACE": cfg.cassandra.keyspace,
            "CQRS_SPARK_CHECKPOINT_DIR": cfg.spark.checkpoint_dir,
            "CQRS_METRICS_PORT": str(port)}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cqrs.cli.main", *args]


def _one_driver(cfg: CqrsConfig, app_ref: str, logs: Path) -> tuple[float, int]:
    port = 19400 + os.getpid() % 500
    started = time.monotonic()
    with (logs / "app.log").open("w") as sink:
        proc = subprocess.Popen(_cli("run", "app", app_ref), env=_env(cfg, port),
                                stdout=sink, stderr=sink)
    try:
        while time.monotonic() - started < TIMEOUT_S:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status.json", timeout=5) as r:
                    s = json.loads(r.read())
                if s["queries"] and all(q["input_rows"] > 0 for q in s["queries"]):
                    ready = time.monotonic() - started
                    time.sleep(SETTLE_S)
                    return ready, tree_rss_bytes(proc.pid)
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"run app not ready; see {logs / 'app.log'}")
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def _separate(cfg: CqrsConfig, app_ref: str, logs: Path) -> tuple[float, int]:
    started = time.monotonic()
    procs, files = [], []
    for name, args in (("processor", ("run", "processor", app_ref)),
                       ("projector", ("run", "projector", app_ref))):
        path = logs / f"{name}.log"
        files.append(path)
        with path.open("w") as sink:
            procs.append(subprocess.Popen(_cli(*args), env=_env(cfg, 0), stdout=sink, stderr=sink))
    try:
        while time.monotonic() - started < TIMEOUT_S:
            for proc, path in zip(procs, files):
                if proc.poll() is not None:  # nothing restarts a failed query here
                    raise RuntimeError(f"{path.stem} exited with {proc.returncode}: see {path}")
            texts = [p.read_text() for p in files]
            # a batch line with records: "batch 0: 20 commands" / "balances g1 batch 0: 20 events"
            if all(any(line.split(": ", 1)[-1][:1] not in ("0", "")
                       for line in t.splitlines() if " batch " in f" {line}" and ": " in line)
                   for t in texts):
                ready = time.monotonic() - started
                time.sleep(SETTLE_S)
                return ready, sum(tree_rss_bytes(p.pid) for p in procs)
            time.sleep(0.5)
        raise TimeoutError(f"separate processes not ready; see {logs}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("app", nargs="?", default="domain_examples.bank:app")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    from cassandra.cluster import Cluster

    base = load_config()
    cluster = Cluster(base.cassandra.contact_points(), port=base.cassandra.port)
    session = cluster.connect()
    print("| mode | processes | start to first batches, s | resident memory, MiB | load average (1, 5, 15 min) |")
    print("| --- | --- | --- | --- | --- |")
    try:
        for _ in range(args.rounds):
            for mode, run in (("cqrs run app", _one_driver), ("run processor + run projector", _separate)):
                token = uuid.uuid4().hex[:8]
                keyspace = f"m_{token}"
                session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = {base.cassandra.replication}")
                logs = Path(tempfile.mkdtemp(prefix="measure-"))
                cfg = base.with_overrides(kafka={"topic_prefix": f"m-{token}-"},
                                          cassandra={"keyspace": keyspace},
                                          spark={"checkpoint_dir": str(logs / "checkpoints")})
                count = 1 if mode == "cqrs run app" else 2
                try:
                    _prepare(cfg, args.app)
                    ready, rss = run(cfg, args.app, logs)
                    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                    print(f"| {mode} | {count} | {ready:.1f} | {rss / 2**20:,.0f} | {load} |", flush=True)
                except (RuntimeError, TimeoutError) as exc:
                    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
                    print(f"| {mode} | {count} | failed: {exc} | - | {load} |", flush=True)
                finally:
                    session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
