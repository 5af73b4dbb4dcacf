"""Benchmark of the projector and the rebuild, end to end on the real stack. Prints figures.

    python bench/projector.py                          # steady stream + 1,000,000-event rebuild
    python bench/projector.py --stream-events 200000 --rebuild-events 0

Steady stream: ``--stream-events`` bank events over ``--accounts`` accounts are written to a
fresh events topic (real envelope and codec, straight to Kafka), then the ``balances`` projector
runs as a streaming query (micro-batches of ``[projections] max_events_per_trigger``) into
Cassandra; the figure is events / (first batch start -> last batch end).

Rebuild: ``--rebuild-events`` events are written to another fresh topic; the figure is the
wall time of ``rebuild_projection`` (the batch over the log, the catch-up, the switch), timed
once Cassandra has flushed and compacted what the steady part wrote and the machine is quiet.

Warm-up: first an untimed rebuild of ``--warm-up-events`` events (as ``bench/processor.py``
makes an untimed run first), so that Kafka's, Cassandra's and Spark's JVMs are compiled and
the Python workers started before anything is measured; ``--no-warm-up`` skips it.

Needs the local stack (``cqrs dev up``) or CQRS_* settings naming one. Uses fresh topics and a
fresh keyspace, dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))

from harness import settle, settled  # noqa: E402

from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.spark_session import spark_session  # noqa: E402
from cqrs.testing.example import AccountOpened, Deposited, Withdrawn  # noqa: E402
from cqrs.topics import ensure_topics, topics_for  # noqa: E402
from projections.apply import BatchStats  # noqa: E402
from projections.rebuild import rebuild_projection  # noqa: E402
from projections.runner import run_projectors  # noqa: E402
from projections.stores import cached_store  # noqa: E402
from projections.testing import app, produce_events, publish_schemas  # noqa: E402

APP_REF = "projections.testing:app"


def history(accounts: int, events: int, seed: int = 1) -> list[tuple[str, object]]:
    rng = random.Random(seed)
    out: list[tuple[str, object]] = [(f"acc-{i}", AccountOpened(f"owner-{i % 1000}"))
                                     for i in range(min(accounts, events))]
    while len(out) < events:
        acc = f"acc-{rng.randrange(accounts)}"
        out.append((acc, Deposited(rng.randint(1, 99)) if rng.random() < 0.8 else Withdrawn(1)))
    return out


def fresh(base: CqrsConfig, tag: str) -> CqrsConfig:
    run = uuid.uuid4().hex[:8]
    return base.with_overrides(kafka={"topic_prefix": f"bench-{tag}-{run}-"},
                               cassandra={"keyspace": f"bench_{tag}_{run}"},
                               spark={"checkpoint_dir": f"/tmp/cqrs-bench/{run}"})


def write_log(cfg: CqrsConfig, events: int, accounts: int) -> float:
    topics = topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    publish_schemas(cfg, topics, app)
    started = time.monotonic()
    produce_events(cfg, topics.events, app, history(accounts, events), versions={})
    seconds = time.monotonic() - started
    print(f"  wrote {events:,} events in {seconds:.1f} s ({events / seconds:,.0f}/s)", flush=True)
    return seconds


def steady(spark: object, base: CqrsConfig, events: int, accounts: int) -> None:
    cfg = fresh(base, "stream")
    print(f"steady stream: {events:,} events over {accounts:,} accounts", flush=True)
    write_log(cfg, events, accounts)
    stop = threading.Event()
    batches: list[tuple[float, float, BatchStats]] = []
    last = [time.monotonic()]
    applied = [0]

    def report(msg: str) -> None:
        print("  " + msg, flush=True)

    original = run_projectors

    def on_report(msg: str) -> None:
        report(msg)
        if " batch " in msg:
            n = int(msg.split(": ")[1].split(" events")[0])
            now = time.monotonic()
            batches.append((last[0], now, BatchStats(events=n)))
            last[0] = now
            applied[0] += n
            if applied[0] >= events:
                stop.set()

    started = time.monotonic()
    original(spark, cfg, APP_REF, ["balances"], stop=stop, report=on_report, poll_s=0.2)  # type: ignore[arg-type]
    counted = [b for b in batches if b[2].events > 0]
    first_batch_start = counted[0][0] if len(counted) < 2 else counted[1][0]
    timed = counted if len(counted) < 2 else counted[1:]  # the first batch pays start-up
    seconds = timed[-1][1] - first_batch_start
    n = sum(b[2].events for b in timed)
    print(f"RESULT steady stream into Cassandra: {n:,} events in {seconds:.1f} s = "
          f"{n / seconds:,.0f} events/s (excluding the first batch; total incl. start-up "
          f"{time.monotonic() - started:.1f} s)", flush=True)
    cached_store(cfg).drop_keyspace()  # type: ignore[attr-defined]


def rebuild(spark: object, base: CqrsConfig, events: int, accounts: int, quiet: bool,
            label: str = "rebuild") -> None:
    cfg = fresh(base, "rebuild")
    print(f"{label}: {events:,} events over {accounts:,} accounts", flush=True)
    write_log(cfg, events, accounts)
    if quiet:  # Cassandra compacting what came before is not the rebuild's work
        settled(cfg, after="before the rebuild")
        settle()
    called = time.monotonic()
    report = rebuild_projection(spark, cfg, APP_REF, "balances",  # type: ignore[arg-type]
                                report=lambda m: print("  " + m, flush=True))
    whole = time.monotonic() - called
    print(f"{'RESULT' if label == 'rebuild' else f'({label})'} rebuild of {report.events:,} events: "
          f"{report.seconds:.1f} s "
          f"({report.events / report.seconds:,.0f} events/s; the whole call, with the checks and "
          f"the new tables: {whole:.1f} s)", flush=True)
    cached_store(cfg).drop_keyspace()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stream-events", type=int, default=600_000)
    parser.add_argument("--rebuild-events", type=int, default=1_000_000)
    parser.add_argument("--accounts", type=int, default=10_000)
    parser.add_argument("--warm-up-events", type=int, default=200_000,
                        help="events of the untimed rebuild made first")
    parser.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=True,
                        help="an untimed rebuild first, so the services' JVMs are compiled")
    parser.add_argument("--settle", action=argparse.BooleanOptionalAction, default=True,
                        help="flush Cassandra and wait for a quiet machine before the rebuild is "
                             "timed (bench/harness.py)")
    args = parser.parse_args()
    base = load_config()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, Spark {base.spark.master}, store {base.projections.store}, "
          f"max_events_per_trigger {base.projections.max_events_per_trigger:,}", flush=True)
    spark = spark_session(base, "cqrs-bench-projector")
    try:
        if args.warm_up and args.warm_up_events:
            rebuild(spark, base, args.warm_up_events, args.accounts, False, label="warm-up")
        if args.stream_events:
            steady(spark, base, args.stream_events, args.accounts)
        if args.rebuild_events:
            rebuild(spark, base, args.rebuild_events, args.accounts, args.settle)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
