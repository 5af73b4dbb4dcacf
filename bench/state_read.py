"""How fast an aggregate's state is read once the service runs: the Python reader
(``StateReader.get``) and ``GET /aggregates/{id}`` of ``cqrs serve``. Prints figures.

    python bench/state_read.py                       # 1,000 aggregates, 2,000 reads each way

The processor runs once (availableNow) over ``--aggregates`` opened accounts with a deposit
each, so the rows are what it writes; then reads of random aggregates are timed one after the
other (the first read, which connects, is not counted). Needs the local stack (``cqrs dev up``).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (  # noqa: E402
    announce, encode_all, fresh_topics, latency_summary, produce, remove_fresh, served_http,
)
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.processor.job import start_processor  # noqa: E402
from cqrs.processor.workers import ProcessorOptions  # noqa: E402
from cqrs.processor.state import StateReader  # noqa: E402
from cqrs.spark_session import spark_session  # noqa: E402
from cqrs.testing.example import Deposit, OpenAccount  # noqa: E402
from cqrs.testing.example_app import app  # noqa: E402

APP_REF = "cqrs.testing.example_app:app"


def _summary(label: str, times: list[float]) -> None:
    s = latency_summary(times)
    print(f"RESULT {label} reads={len(times)} p50_ms={s['p50_s'] * 1000:.2f} "
          f"p99_ms={s['p99_s'] * 1000:.2f} max_ms={s['max_s'] * 1000:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args()

    cfg = load_config()
    try:
        measure_reads(cfg, args)
    finally:
        remove_fresh(cfg)


def measure_reads(cfg: CqrsConfig, args: argparse.Namespace) -> None:
    topics = fresh_topics(cfg, app.name, "state")
    prefix = topics.commands.removesuffix(f"{app.name}.commands")
    cfg = cfg.with_overrides(kafka={"topic_prefix": prefix})
    ids = [f"acc-{a}" for a in range(args.aggregates)]
    produce(cfg, topics.commands, encode_all(app, [(i, OpenAccount("o")) for i in ids]
                                             + [(i, Deposit(5)) for i in ids]))
    spark = spark_session(cfg, "cqrs-bench-state")
    query = start_processor(spark, cfg, ProcessorOptions(
        APP_REF, topics=topics, checkpoint=cfg.spark.checkpoint_location("bench", prefix + "p")),
        available_now=True)
    query.awaitTermination()
    spark.stop()

    rng = random.Random(7)
    announce("StateReader.get")
    with StateReader(app, cfg, topics=topics) as reader:
        assert reader.get(ids[0]) is not None  # connects
        times = []
        for _ in range(args.reads):
            started = time.perf_counter()
            state = reader.get(rng.choice(ids))
            times.append(time.perf_counter() - started)
            assert state is not None and state.version == 2
    _summary("state_reader", times)

    with served_http(APP_REF, prefix) as http:
        assert http.get(f"/aggregates/{ids[0]}").status_code == 200  # connects
        announce("GET /aggregates/{id}")
        times = []
        for _ in range(args.reads):
            started = time.perf_counter()
            r = http.get(f"/aggregates/{rng.choice(ids)}")
            times.append(time.perf_counter() - started)
            assert r.status_code == 200 and r.json()["version"] == 2
    _summary("http", times)


if __name__ == "__main__":
    main()
