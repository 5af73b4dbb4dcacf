"""Where the command processor's worker spends its time, without Spark: one process runs
:func:`cqrs.processor.partition.run_task` over slices of the commands topic exactly as a Spark
task does (same Worker, state table, producer), under cProfile.

    python bench/slice_profile.py --aggregates 1000 --commands 100000 --slice 25000
    python bench/slice_profile.py --bank personal --no-profile   # holder and e-mail personal

prints CPU microseconds per command and wall time per phase (fetch, read, step, produce, write) and the top
functions by own time. Needs the local stack (``cqrs dev up``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import encode_all, fresh_topics, produce, remove_fresh  # noqa: E402

from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.personal.keys import KeyCache  # noqa: E402
from cqrs.processor.changelog import check_state_store  # noqa: E402
from cqrs.processor.job import publish_app_schemas  # noqa: E402
from cqrs.processor.workers import ProcessorOptions, worker_for  # noqa: E402
from cqrs.processor.partition import SliceStats, StateCache, run_task  # noqa: E402
from cqrs.processor.state_table import open_state_table  # noqa: E402
from cqrs.processor.step import DedupPolicy  # noqa: E402
from processor import EXAMPLE, Bank, bank_codec, personal_banks, with_run_master_key  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aggregates", type=int, default=1000)
    ap.add_argument("--commands", type=int, default=100_000)
    ap.add_argument("--slice", type=int, default=25_000, help="commands per slice (per task)")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--dedup-max", type=int, default=None,
                    help="command ids remembered per aggregate (default: the processor's)")
    ap.add_argument("--bank", choices=("example", "plain", "personal"), default="example",
                    help="the app: the example bank (default), or domain_examples/personal_bank.py "
                         "with holder and e-mail on every event in clear (plain) or personal")
    ap.add_argument("--dump", help="also write the profile to this file (for pstats / snakeviz)")
    ap.add_argument("--no-profile", action="store_true", help="timings only (cProfile adds ~2x)")
    ap.add_argument("--cold", action="store_true",
                    help="forget the warm-up's cached states (and data subjects' keys): every "
                         "aggregate is read from the state table, every key from the key table "
                         "(a worker that did not process the partition before)")
    args = ap.parse_args(argv)

    cfg = load_config()
    bank = EXAMPLE
    if args.bank != "example":
        cfg = with_run_master_key(cfg)
        bank = personal_banks()[args.bank == "personal"]
    try:
        profile_slices(cfg, args, bank)
    finally:
        remove_fresh(cfg)


def profile_slices(cfg: CqrsConfig, args: argparse.Namespace, bank: Bank) -> None:
    app = bank.app
    topics = fresh_topics(cfg, app.name, "sliceprof")
    publish_app_schemas(cfg, topics, app)
    table = open_state_table(cfg, topics)
    generation = table.ensure_current()
    check_state_store(cfg, table, topics, generation)  # the changelog, with state_store = "kafka"
    table.close()
    from cqrs.kafka_io import watermarks

    parts = sorted(watermarks(cfg, topics.commands))
    dedup = DedupPolicy() if args.dedup_max is None else DedupPolicy(max_per_aggregate=args.dedup_max)
    opts = ProcessorOptions(bank.ref, topics=topics, dedup=dedup,
                            results_partitions=len(parts), state_generation=generation)
    worker = worker_for(cfg, opts)
    codec = bank_codec(cfg, bank)
    opened = encode_all(app, [(f"{bank.prefix}{a}", bank.open(f"{bank.prefix}{a}", a))
                              for a in range(args.aggregates)], codec)
    work = encode_all(app, [(f"{bank.prefix}{n % args.aggregates}", bank.deposit(1 + n % 100))
                            for n in range(args.commands)], codec)
    produce(cfg, topics.commands, opened)
    done: dict[int, int] = {p: 0 for p in parts}

    task_cpu = [0.0]  # the tasks' CPU, with what a task does around its slices (its end's collection)

    def drain(profile: cProfile.Profile | None) -> tuple[SliceStats, float, int]:
        stats, wall = SliceStats(), time.perf_counter()
        task_cpu[0] = 0.0
        while True:
            high = {p: hi for p, (_, hi) in watermarks(cfg, topics.commands).items()}
            ranges = {p: (done[p], min(high[p], done[p] + args.slice // len(parts) + 1))
                      for p in parts if high[p] > done[p]}
            if not ranges:
                return stats, time.perf_counter() - wall, stats.commands
            if profile is not None:
                profile.enable()
            cpu = time.process_time()
            stats.add(run_task(worker, topics.commands, ranges))  # a task of a micro-batch
            task_cpu[0] += time.process_time() - cpu
            if profile is not None:
                profile.disable()
            for p, (_, end) in ranges.items():
                done[p] = end

    drain(None)  # the warm-up: open every account
    if args.cold:
        worker.cache = StateCache(worker.cache.capacity)
        if isinstance(worker.step.codec.key_store, KeyCache):
            worker.step.codec.key_store.clear()
    produce(cfg, topics.commands, work)
    print(f"timed part starts (pid {os.getpid()}: attach a sampling profiler now)", flush=True)
    profile = None if args.no_profile else cProfile.Profile()
    stats, wall, total = drain(profile)
    us = 1e6 / max(total, 1)
    print(f"{total:,} commands over {args.aggregates:,} aggregates in slices of ~{args.slice:,}: "
          f"{wall:.2f} s wall, {total / wall:,.0f}/s in one process")
    print(f"CPU per command: tasks {task_cpu[0] * us:.1f} us, of which slices {stats.cpu_s * us:.1f} us "
          f"(wall per command: fetch {stats.fetch_s * us:.1f}, read {stats.read_s * us:.1f}, step {stats.step_s * us:.1f}, "
          f"produce {stats.produce_s * us:.1f}, write {stats.write_s * us:.1f} us); cache hits "
          f"{stats.cache_hits:,} (packed {stats.store_hits:,}), state reads {stats.state_reads:,}, "
          f"restored {stats.restored:,}")
    if profile is not None:
        print("(times under cProfile, about 2x the real ones)")
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
        if args.dump:
            profile.dump_stats(args.dump)
    bank.forget_accounts(cfg, args.aggregates)


if __name__ == "__main__":
    main()
