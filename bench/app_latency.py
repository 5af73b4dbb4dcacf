"""Round trips of commands under ``cqrs run app``: the processor sharing its Spark driver with a
projector and the history job, as an app runs in production on one machine. Prints figures;
not a timed test.

    python bench/app_latency.py                        # 64 commands/s over 16 aggregates, 30 s
    python bench/app_latency.py --rate 200 --seconds 60
    python bench/app_latency.py --no-projectors        # the processor (and history job) alone

The app is ``tests/integration/apps/bad_inputs_app.py`` (a note per aggregate; its ``notes``
projection counts what was written), run as a ``cqrs run app ... --trigger "500 milliseconds"
--no-retrier --no-process-managers --no-scheduler`` subprocess on fresh topics and a fresh
keyspace. After a warm-up command, a thread sends ``Write`` commands at ``--rate`` round robin
over ``--aggregates`` aggregates through a ``CommandClient`` for ``--seconds``; a round trip is
``send`` -> its result's callback. While it runs, the app's ``/status.json`` is polled and each
query's micro-batches are counted with their mean duration, so a long tail can be matched to
what the driver was doing. Writes ``bench/results/app-latency-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
APPS = ROOT / "tests" / "integration" / "apps"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(APPS))

from bad_inputs_app import Write, app  # noqa: E402
from harness import announce, fresh_topics, latency_summary, remove_fresh  # noqa: E402

from cqrs.cassandra_io import CassandraSession  # noqa: E402
from cqrs.client import CommandClient  # noqa: E402
from cqrs.config import load_config  # noqa: E402

RESULTS = ROOT / "bench" / "results"
APP_REF = "bad_inputs_app:app"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=64.0, help="commands per second (64)")
    parser.add_argument("--aggregates", type=int, default=16, help="aggregates, round robin (16)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to send (30)")
    parser.add_argument("--no-projectors", action="store_true", help="run the app without them")
    parser.add_argument("--port", type=int, default=19555, help="the app's status port")
    parser.add_argument("--results-dir", type=Path, default=RESULTS,
                        help="folder of the JSON results (default bench/results)")
    args = parser.parse_args(argv)

    tag = uuid.uuid4().hex[:8]
    base = load_config()
    topics = fresh_topics(base, app.name, "app")  # removed again on the way out
    prefix = topics.commands.removesuffix(f"{app.name}.commands")
    cfg = base.with_overrides(kafka={"topic_prefix": prefix},
                              cassandra={"keyspace": f"bench_app_{tag}"})
    log = Path(f"/tmp/app-latency-{tag}.log")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), *sys.path]),
           "CQRS_KAFKA_TOPIC_PREFIX": prefix, "CQRS_CASSANDRA_KEYSPACE": cfg.cassandra.keyspace,
           "CQRS_SPARK_CHECKPOINT_DIR": f"/tmp/app-latency-{tag}", "CQRS_METRICS_PORT": str(args.port)}
    argv_app = [sys.executable, "-m", "cqrs.cli.main", "run", "app", APP_REF, "--trigger",
                "500 milliseconds", "--no-retrier", "--no-process-managers", "--no-scheduler"]
    if args.no_projectors:
        argv_app.append("--no-projectors")
    load = announce(f"cqrs run app{' --no-projectors' if args.no_projectors else ''}: "
                    f"{args.rate:g} commands/s over {args.aggregates} aggregates for {args.seconds:g} s")
    with log.open("w") as out:
        proc = subprocess.Popen(argv_app, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    client = CommandClient(app, cfg)
    trips: list[float] = []
    batches: dict[str, list[float]] = {}
    try:
        client.send_and_wait("warm-up", Write("w"), timeout=300)
        stop = threading.Event()

        def send() -> None:
            n, due = 0, time.monotonic()
            while not stop.is_set():
                sent = time.monotonic()
                future = client.send(f"agg-{n % args.aggregates}", Write("b"))
                future.add_done_callback(lambda f, s=sent: trips.append(time.monotonic() - s))
                n += 1
                due += 1 / args.rate
                stop.wait(max(0.0, due - time.monotonic()))

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        seen: set[tuple[str, Any]] = set()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/status.json", timeout=2) as r:  # noqa: S310
                for q in json.loads(r.read())["queries"]:
                    mark = (q["name"], q.get("last_progress_at"))
                    if q.get("last_progress_at") and mark not in seen:
                        seen.add(mark)
                        batches.setdefault(q["name"], []).append(
                            q.get("phases_ms", {}).get("triggerExecution", 0.0))
            time.sleep(0.25)
        stop.set()
        sender.join(10)
        time.sleep(3.0)  # the last ones answered
    finally:
        client.close()
        os.killpg(proc.pid, 15)
        proc.wait(120)
        remove_fresh(cfg)
        db = CassandraSession(cfg.cassandra)
        try:
            db.execute(f"DROP KEYSPACE IF EXISTS {cfg.cassandra.keyspace}")
        finally:
            db.close()
    summary = latency_summary(trips)
    row = {"trips": len(trips), **{k: round(v * 1000, 1) for k, v in summary.items()},
           "batches": {k: {"count": len(v), "mean_ms": round(sum(v) / len(v))}
                       for k, v in batches.items() if v},
           "load": load, "rate": args.rate, "aggregates": args.aggregates,
           "seconds": args.seconds, "projectors": not args.no_projectors}
    print(f"RESULT {row['trips']} round trips: p50 {row['p50_s']:.0f} ms, p99 {row['p99_s']:.0f} ms, "
          f"max {row['max_s']:.0f} ms; micro-batches {row['batches']}", flush=True)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out_path = args.results_dir / f"app-latency-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out_path.write_text(json.dumps({"meta": {"bench": "app_latency", "argv": sys.argv[1:],
                                             "machine": platform.node(), "cpus": os.cpu_count()},
                                    "rows": [row]}, indent=1))
    print(f"results: {out_path}")


if __name__ == "__main__":
    main()
