"""Benchmark of the command processor, end to end on the real stack, with its floor and its
peers measured in the same invocation on the same box. Prints figures; never a test.

    python bench/processor.py                       # ours, the Spark floor, the eventsourcing peer
    python bench/processor.py --with-kstreams       # ... then the Kafka Streams peer too
    python bench/processor.py --aggregates 1000 10000 100000 1000000 --no-latency --no-floor --no-peers
    python bench/processor.py --aggregates 1000 --commands 5000 --seconds 5   # a short check

Ours, throughput (``--aggregates``, ``--commands``): the processor runs as a streaming query
as ``cqrs run processor`` runs it (``continuous=True``: micro-batches back to back); every aggregate is opened first (warm-up, not timed); the
deposits (deposit n to aggregate ``n % N``, amount ``1 + n % 100``) are encoded before the
clock starts, then produced as fast as possible; the figure is commands / (first command
produced -> last result readable in the results topic). ``--commands`` defaults to 100,000,
or to the number of aggregates when that is larger (1,000,000 aggregates: 1,000,000 deposits).
Peak RSS of the Spark JVM and its Python workers is sampled from /proc during each run.

Ours, latency (``--rate``, ``--seconds``): commands offered at a fixed rate (default 500/s for
30 s) over 1,000 aggregates (``--latency-aggregates``); round trip = produce call -> result
consumed; p50, p99, max.

The Spark floor (``--floor``, default on; ``bench/floor.py``): a stateless Kafka -> Kafka
query copying the commands topic to another (key, value, headers), and the same with a Python
identity ``mapInArrow`` in the middle; the latency case at the same rate as ours, and the
throughput of copying ``--commands`` commands.

The Python peer (``--peers``, default on; ``bench/peers.py``): the ``eventsourcing`` library
with its SQLite and its in-memory (POPO) persistence on the same bank job, each in a fresh
process after our Spark session has stopped (``--peer-aggregates``, default 1,000 and 100,000).

The Kafka Streams peer (``--with-kstreams``; ``bench/kstreams.py``): its ``./run-bench.sh``
after everything else (never at the same time as ours), its figures read from its JSON lines.

Personal fields (``--personal``, instead of the runs above; #26): the throughput run of ours on
the bank of ``domain_examples/personal_bank.py`` with the holder's name and e-mail on every
event and state, once written in clear (``plain_app``) and once declared ``personal()``
(``app``: each event and state row has two fields encrypted with the account's key), in turns,
``--rounds`` times (default 2) in one Spark session, plain first in odd rounds and personal
first in even ones; prints each pair's figures and the ratio personal / plain, and their mean
and median. A master key is made for the run (``[personal_data] master_key``), the keys
go to the key table of ``[cassandra] keyspace``, one per account.

At the end: a Markdown table with every figure, its ratio to ours and the load average before
each run; the figures as JSON in ``bench/results/<timestamp>.json``; and with ``--plot``
(default on) PNGs under ``docs/img/`` (``bench/report.py`` redraws them from a JSON file).

Before anything is measured, one untimed run of ours (100,000 deposits over 1,000 aggregates;
``--no-warm-up`` skips it) brings the services' JVMs to speed: they compile under load, not
with time. The first runs on a stack that had processed nothing yet measured Kafka at 14-25 µs
of CPU per command against 3-6 warmed, Cassandra at 14-17 against 2-6, and the stateless floor
a third lower, 2 and 16 minutes after ``cqrs dev up``.

Needs the local stack (``cqrs dev up``) or CQRS_* settings naming one, and the ``bench`` extra
(``pip install -e '.[test,bench]'``). Uses fresh topics.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import base64
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import attrs  # noqa: E402

from cqrs.app import App  # noqa: E402
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.processor.job import start_processor  # noqa: E402
from cqrs.processor.source import new_stop_file  # noqa: E402
from cqrs.processor.workers import ProcessorOptions  # noqa: E402
from cqrs.processor.partition import SliceStats  # noqa: E402
from cqrs.spark_session import spark_session, stop_between_batches  # noqa: E402
from cqrs.testing.example import Deposit, OpenAccount  # noqa: E402
from cqrs.testing.example_app import app  # noqa: E402
from cqrs.topics import AppTopics  # noqa: E402

from floor import floor_latency, floor_name, floor_throughput  # noqa: E402
from harness import (  # noqa: E402
    Encoded, ResultWatcher, announce, encode_all, fresh_topics, latency_summary, remove_fresh,
    produce, settled, stack_pids, timeout_for,
)
from kstreams import DEFAULT_DIR as KSTREAMS_DIR  # noqa: E402
from kstreams import kstreams_rows, run_kstreams  # noqa: E402
from procmem import ComponentCpu, MachineCpu, SparkMemorySampler  # noqa: E402
from report import (  # noqa: E402
    DEFAULT_IMG_DIR, DEFAULT_RESULTS_DIR, OURS, plot_all, summary_table, write_results,
)

APP_REF = "cqrs.testing.example_app:app"
ROOT = Path(__file__).resolve().parents[1]
LATENCY_AGGREGATES = 1000

Row = dict[str, Any]


@attrs.frozen
class Bank:
    """A bank app the throughput run measures: its reference (for Spark's workers), how to
    open account ``a`` (id ``acc-a``) and make a deposit of an amount."""

    label: str
    app: App
    ref: str
    open: Callable[[str, int], object]
    deposit: Callable[[int], object]
    prefix: str = "acc-"  # of the aggregate ids: account ``a`` is ``f"{prefix}{a}"``

    def forget_accounts(self, cfg: CqrsConfig, aggregates: int) -> None:
        """Delete the keys a run of an app with personal fields made (one per account), with
        plain deletes, not ``forget``: nobody uses these subjects again, and a forget's record
        (which every key cache reads for days, see ``cqrs_forgotten_subjects``) would have the
        next runs' caches read 100,000 forgotten subjects and check every cached state's key:
        a load no app has (its forgets are a few a day)."""
        from cqrs.personal import key_store_for
        from cqrs.personal.cassandra_keys import COPY_TABLE, KEY_TABLE, CassandraKeyStore, copy_bucket
        from cqrs.personal.keys import KeyCache

        store = key_store_for(cfg, self.app)
        table = store.store if isinstance(store, KeyCache) else store
        if isinstance(table, CassandraKeyStore):
            subjects = [f"{self.prefix}{a}" for a in range(aggregates)]
            uncopy = table.session.prepare(
                f"DELETE FROM {COPY_TABLE} WHERE bucket = ? AND subject = ?", write=True)
            table.session.concurrent(uncopy, [(copy_bucket(s), s) for s in subjects])
            delete = table.session.prepare(f"DELETE FROM {KEY_TABLE} WHERE subject = ?", write=True)
            table.session.concurrent(delete, [(s,) for s in subjects])
        if isinstance(store, KeyCache):
            store.clear()


EXAMPLE = Bank(OURS, app, APP_REF, lambda _acc, a: OpenAccount(f"owner {a}"), Deposit)


def personal_banks() -> tuple[Bank, Bank]:
    """The bank of domain_examples/personal_bank.py with its holder and e-mail in clear, and
    declared personal."""
    from domain_examples.personal_bank import COMMANDS
    from domain_examples.personal_bank import app as personal_app
    from domain_examples.personal_bank import plain_app

    token = os.urandom(4).hex()  # the accounts are data subjects: new ones (see fresh_accounts)

    def bank(label: str, of: App, ref: str) -> Bank:
        kinds = COMMANDS[of.name]
        return Bank(label, of, ref,
                    lambda acc, a: kinds.open_account(acc, f"Holder Number {a}", f"holder.{a}@example.com"),
                    kinds.deposit, f"acc-{token}-")

    return (bank(f"{OURS}, plain fields", plain_app, "domain_examples.personal_bank:plain_app"),
            bank(f"{OURS}, personal fields", personal_app, "domain_examples.personal_bank:app"))


def commands_for(aggregates: int, commands: int | None) -> int:
    """``--commands``, or by default 100,000 and at least one per aggregate."""
    return commands if commands is not None else max(100_000, aggregates)


def deposits(aggregates: int, commands: int, bank: Bank = EXAMPLE) -> list[tuple[str, object]]:
    return [(f"{bank.prefix}{n % aggregates}", bank.deposit(1 + n % 100)) for n in range(commands)]


def bank_codec(cfg: CqrsConfig, bank: Bank) -> Any:
    """The codec the bench encodes ``bank``'s commands with: the client's, with the key store
    of the stack for an app with personal fields."""
    from cqrs.personal import key_store_for

    return bank.app.codec_for(bank.app.codec.store, key_store=key_store_for(cfg, bank.app))


class SliceTotals:
    """The processor's own per-slice figures (cache hits, state reads, phase times), summed
    over the micro-batches since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.total = SliceStats()

    def reset(self) -> None:
        self.total = SliceStats()

    def on_batch(self, _batch_id: int, stats: SliceStats) -> None:
        self.total.add(stats)

    def report(self) -> dict[str, Any]:
        t = self.total
        us = 1e6 / max(t.commands, 1)
        print(f"  slices: {t.commands:,} commands, cache hits {t.cache_hits:,} (packed "
              f"{t.store_hits:,}), state reads {t.state_reads:,}; per command: worker CPU "
              f"{t.cpu_s * us:.0f} us, wall read {t.read_s * us:.0f}, step {t.step_s * us:.0f}, "
              f"produce {t.produce_s * us:.0f}, write {t.write_s * us:.0f} us; decided by "
              f"bridges {t.bridged:,}, waited for "
              f"another worker's bridge {t.bridge_wait_s:.2f} s", flush=True)
        return {"commands": t.commands, "cache_hits": t.cache_hits, "store_hits": t.store_hits,
                "state_reads": t.state_reads,
                "bridged": t.bridged, "bridge_wait_s": round(t.bridge_wait_s, 3),
                "us_per_command": {k: round(getattr(t, k) * us, 1)
                                   for k in ("cpu_s", "fetch_s", "read_s", "step_s", "produce_s", "write_s")}}


@contextlib.contextmanager
def running_processor(cfg: CqrsConfig, spark: Any, aggregates: int, bank: Bank = EXAMPLE,
                      settle: bool = True) -> Iterator[tuple[AppTopics, ResultWatcher, Any, SliceTotals]]:
    """Fresh topics, a results watcher and a running processor with every account opened
    (and with ``settle``, Cassandra flushed and the stack quiet: :func:`settled`)."""
    topics = fresh_topics(cfg, bank.app.name, "processor")
    watcher = ResultWatcher(cfg, topics.results)
    watcher.start()
    checkpoint = cfg.spark.checkpoint_location("bench", topics.commands.replace(".", "-"))
    slices = SliceTotals()
    # as `cqrs run processor` runs it: the only query of its driver, stopped between two of
    # its micro-batches (query.stop() alone interrupts a serving task: Spark then logged the
    # query's failure, a StackOverflowError in one of its own regular expressions)
    stop_file = new_stop_file()
    query = start_processor(spark, cfg, ProcessorOptions(bank.ref, topics=topics, checkpoint=checkpoint),
                            on_batch=slices.on_batch, continuous=True, stop_file=stop_file)
    try:
        opened = encode_all(bank.app, [(f"{bank.prefix}{a}", bank.open(f"{bank.prefix}{a}", a))
                                       for a in range(aggregates)], bank_codec(cfg, bank))
        print(f"warm-up: opening {aggregates:,} accounts", flush=True)
        started = time.monotonic()
        produce(cfg, topics.commands, opened)
        watcher.wait_for([r.cid for r in opened], timeout_for(aggregates), "warm-up", query)
        del opened  # a million encoded commands hold ~2 GB
        committed(query)
        print(f"warm-up: done in {time.monotonic() - started:.1f} s", flush=True)
        if settle:
            settled(cfg)
        slices.reset()
        yield topics, watcher, query, slices
    finally:
        stop_between_batches([(query, Path(stop_file).touch)])
        watcher.stop()
        bank.forget_accounts(cfg, aggregates)


def committed(query: Any, timeout_s: float = 60.0) -> None:
    """Wait until the micro-batch running now has been committed. The warm-up's answers come
    while the batch that wrote them still runs (it serves on, then commits); the Kafka Streams
    peer's answers are read only once its transaction committed, so its warm-up ends after its
    commit. Waiting for ours too keeps the timed window out of the query's first batches (the
    first commit and the batch after it carry the query's one-time start-up costs)."""
    last = query.lastProgress
    seen = -1 if last is None else last["batchId"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = query.lastProgress
        if now is not None and now["batchId"] > seen:
            return
        if query.exception() is not None:
            raise RuntimeError(f"the processor failed: {query.exception()}")
        time.sleep(0.02)
    raise RuntimeError(f"no micro-batch was committed within {timeout_s:.0f} s of the warm-up")


def throughput(cfg: CqrsConfig, spark: Any, aggregates: int, commands: int,
               bank: Bank = EXAMPLE, settle: bool = True) -> Row:
    load = announce(f"{bank.label}: throughput, {commands:,} deposits over {aggregates:,} aggregates")
    started = time.monotonic()
    work = encode_all(bank.app, deposits(aggregates, commands, bank), bank_codec(cfg, bank))
    print(f"encoded {commands:,} deposits in {time.monotonic() - started:.1f} s (before the clock)", flush=True)
    with SparkMemorySampler() as mem, running_processor(cfg, spark, aggregates, bank, settle) as (topics, watcher, query, slices):
        cpu, parts = MachineCpu(), ComponentCpu(stack_pids(cfg))
        started = time.monotonic()
        produce(cfg, topics.commands, work)
        produced = time.monotonic() - started
        last = watcher.wait_for([r.cid for r in work], timeout_for(commands, 1800), "timed", query)
        machine, by_part = cpu.percent(), parts.seconds()
        batches = batch_report(query)
        batches["slices"] = slices.report()
    elapsed = last - started
    rate = commands / elapsed
    peak = mem.peak()
    print(f"RESULT throughput aggregates={aggregates} commands={commands} seconds={elapsed:.1f} "
          f"commands_per_s={rate:,.0f} (producing took {produced:.1f} s) peak RSS MiB: "
          f"JVM {peak.jvm_mib:,.0f}, workers {peak.workers_mib:,.0f} ({peak.workers})", flush=True)
    print("CPU in the window, us per command: " + ", ".join(
        f"{k} {v / commands * 1e6:,.0f}" for k, v in by_part.items()), flush=True)
    return {"system": bank.label, "kind": "throughput", "aggregates": aggregates, "commands": commands,
            "seconds": round(elapsed, 3), "commands_per_s": round(rate), "produce_seconds": round(produced, 3),
            "loadavg": load, "machine_pct": machine, "cpu_s": by_part, "memory": peak.as_dict(),
            "batches": batches}


def batch_report(query: Any) -> dict[str, Any]:
    """Where the micro-batches spent their time (Spark's own progress reports); printed too."""
    batches = [p for p in query.recentProgress if p.get("numInputRows")]
    if not batches:
        return {}
    phases: dict[str, float] = {}
    for p in batches:
        for phase, ms in p.get("durationMs", {}).items():
            phases[phase] = phases.get(phase, 0.0) + ms
    rows = sum(p["numInputRows"] for p in batches)
    print(f"  {len(batches)} batches with input, {rows / len(batches):,.0f} rows per batch; total ms by phase: "
          + ", ".join(f"{k}={v:,.0f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1])),
          flush=True)
    return {"count": len(batches), "rows_per_batch": round(rows / len(batches)), "ms_by_phase": phases}


def latency(cfg: CqrsConfig, spark: Any, rate: float, seconds: float,
            aggregates: int = LATENCY_AGGREGATES, settle: bool = True) -> Row:
    load = announce(f"{OURS}: latency, {rate:.0f}/s for {seconds:.0f} s over {aggregates:,} aggregates")
    total = int(rate * seconds)
    work: list[Encoded] = encode_all(app, [(f"acc-{n % aggregates}", Deposit(1)) for n in range(total)])
    with SparkMemorySampler() as mem, running_processor(cfg, spark, aggregates, settle=settle) as (topics, watcher, query, slices):
        cpu, parts = MachineCpu(), ComponentCpu(stack_pids(cfg))
        sent_at: dict[bytes, float] = {}
        produce(cfg, topics.commands, work, sent_at=sent_at, rate=rate)
        ids = [r.cid for r in work]
        watcher.wait_for(ids, timeout_for(total, 600), "latency", query)
        rtt = [watcher.arrived[i] - sent_at[i] for i in ids]
        machine, by_part = cpu.percent(), parts.seconds()
        batches = batch_report(query)
        batches["slices"] = slices.report()
    print("CPU in the window, % of one core: " + ", ".join(
        f"{k} {v / seconds * 100:,.0f}" for k, v in by_part.items()), flush=True)
    stats = latency_summary(rtt)
    print(f"RESULT latency rate={rate:.0f}/s commands={total} p50_s={stats['p50_s']:.3f} "
          f"p99_s={stats['p99_s']:.3f} max_s={stats['max_s']:.3f}", flush=True)
    return {"system": OURS, "kind": "latency", "rate_per_s": rate, "seconds": seconds,
            "aggregates": aggregates, "commands": total, **stats,
            "rtt_s": [round(x, 4) for x in rtt], "loadavg": load, "machine_pct": machine,
            "cpu_s": by_part, "memory": mem.peak().as_dict(), "batches": batches}


def attempt(rows: list[Row], system: str, kind: str, run: Callable[[], Row | list[Row]],
            **context: Any) -> None:
    """Run one measurement; a failure becomes a row with its error and the rest goes on (the
    processor may be mid-rewrite: the floor and the peers still measure)."""
    try:
        got = run()
    except Exception as exc:  # noqa: BLE001 - reported, and the other runs go on
        traceback.print_exc()
        print(f"FAILED {system} {kind}: {exc}", flush=True)
        rows.append({"system": system, "kind": kind, "error": f"{type(exc).__name__}: {exc}", **context})
        return
    rows.extend(got if isinstance(got, list) else [got])


def peer_rows(rows: list[Row], aggregates: list[int], commands: int | None, snapshot_interval: int) -> None:
    from peers import run_peer_process

    for persistence in ("sqlite", "popo"):
        for n in aggregates:
            m = commands_for(n, commands)
            system = f"eventsourcing {persistence}"

            def run(persistence: str = persistence, n: int = n, m: int = m, system: str = system) -> Row:
                load = announce(f"{system}: throughput, {m:,} deposits over {n:,} aggregates")
                row = run_peer_process(persistence, n, m, snapshot_interval)
                print(f"RESULT {system} aggregates={n} commands={m} seconds={row['seconds']:.1f} "
                      f"commands_per_s={row['commands_per_s']:,} (opening took {row['open_seconds']:.1f} s)",
                      flush=True)
                return {**row, "loadavg": load}

            attempt(rows, system, "throughput", run, aggregates=n, commands=m)


def kstreams_run(peer_dir: Path, aggregates: list[int]) -> list[Row]:
    """The peer at the same sizes as ours (its AGGREGATES), and its latency run."""
    load = announce(f"kafka streams: AGGREGATES=\"{' '.join(map(str, aggregates))}\" "
                    f"{peer_dir}/run-bench.sh (its own Kafka on 29092; 2 min, more at 1,000,000)")
    records = run_kstreams(peer_dir, timeout_s=3600, aggregates=aggregates)
    if not records:
        raise RuntimeError("./run-bench.sh printed no result line")
    return kstreams_rows(records, load)


def code_version() -> dict[str, Any]:
    """The commit measured, whether the framework's code differed from it, and the versions of
    the libraries (a figure belongs to a code state)."""
    from importlib.metadata import PackageNotFoundError, version

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    versions = {}
    for package in ("pyspark", "pyarrow", "confluent-kafka", "eventsourcing", "matplotlib"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "framework_modified": bool(git("status", "--porcelain", "--", "cqrs", "projections")),
            "versions": versions}


def machine_summary(cfg: CqrsConfig) -> dict[str, Any]:
    summary = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
               f"Spark {cfg.spark.master}, {cfg.kafka.default_partitions} topic partitions")
    return {"summary": summary, "cores": os.cpu_count(), "python": platform.python_version(),
            "spark_master": cfg.spark.master, "topic_partitions": cfg.kafka.default_partitions}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aggregates", type=int, nargs="*", default=[1000, 100_000],
                        help="our throughput runs, one per count (default: 1000 100000)")
    parser.add_argument("--commands", type=int, default=None,
                        help="deposits per throughput run (default: 100,000, at least one per aggregate)")
    parser.add_argument("--rate", type=float, default=500.0, help="offered commands/s of the latency runs")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the latency runs")
    parser.add_argument("--latency-aggregates", type=int, default=LATENCY_AGGREGATES,
                        help="aggregates of the latency runs and of the floor's (default 1000; "
                             "fewer for a smoke run: each is opened before the clock starts)")
    parser.add_argument("--warm-up", action=argparse.BooleanOptionalAction, default=True,
                        help="one untimed run of ours first, so the services' JVMs are compiled")
    parser.add_argument("--settle", action=argparse.BooleanOptionalAction, default=True,
                        help="before each timed run, flush Cassandra, wait for its compactions "
                             "and for a quiet stack (default: on; ~2-16 s a run, most of it "
                             "nodetool's JVM; a smoke run needs none)")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--ours", action=argparse.BooleanOptionalAction, default=True,
                        help="our processor's runs (default: on; --no-ours measures only the others)")
    parser.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                        help="the stateless Spark Kafka -> Kafka queries (default: on)")
    parser.add_argument("--peers", action=argparse.BooleanOptionalAction, default=True,
                        help="the eventsourcing library, SQLite and POPO (default: on; throughput "
                             "runs, so --no-throughput skips them too)")
    parser.add_argument("--peer-aggregates", type=int, nargs="*", default=[1000, 100_000])
    parser.add_argument("--peer-snapshot-interval", type=int, default=0,
                        help="eventsourcing snapshots every N events (default 0: none; see bench/peers.py)")
    parser.add_argument("--personal", action="store_true",
                        help="instead of the runs above: the bank with two fields per event in "
                             "clear, then personal, in turns (--rounds), and the ratio")
    parser.add_argument("--rounds", type=int, default=2,
                        help="--personal: pairs of runs, plain then personal (default 2)")
    parser.add_argument("--with-kstreams", action="store_true",
                        help="run the Kafka Streams peer's ./run-bench.sh after everything else")
    parser.add_argument("--kstreams-dir", type=Path, default=KSTREAMS_DIR)
    parser.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True,
                        help="PNG plots from the figures (default: on)")
    parser.add_argument("--img-dir", type=Path, default=DEFAULT_IMG_DIR)
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    return parser.parse_args(argv)


WARM_UP_AGGREGATES, WARM_UP_COMMANDS = 1000, 100_000


def spark_rows(cfg: CqrsConfig, args: argparse.Namespace, rows: list[Row]) -> None:
    """Ours, then the floor, in one Spark session, stopped at the end (the peers run after)."""
    spark = spark_session(cfg, "cqrs-bench-processor")
    latency_aggregates = args.latency_aggregates
    latency_context = {"aggregates": latency_aggregates, "rate_per_s": args.rate, "seconds": args.seconds}
    try:
        if args.warm_up and (args.ours or args.floor):
            print(f"\n== warm-up, not recorded: {WARM_UP_COMMANDS:,} deposits over "
                  f"{WARM_UP_AGGREGATES:,} aggregates (the services' JVMs compile under load)",
                  flush=True)
            throughput(cfg, spark, WARM_UP_AGGREGATES, WARM_UP_COMMANDS, settle=args.settle)
        if args.ours and not args.no_throughput:
            for aggregates in args.aggregates:
                m = commands_for(aggregates, args.commands)
                attempt(rows, OURS, "throughput", partial(throughput, cfg, spark, aggregates, m, settle=args.settle),
                        aggregates=aggregates, commands=m)
        if args.ours and not args.no_latency:
            attempt(rows, OURS, "latency",
                    partial(latency, cfg, spark, args.rate, args.seconds, latency_aggregates,
                            args.settle),
                    **latency_context)
        if not args.floor:
            return
        for arrow in (False, True):
            if not args.no_latency:
                attempt(rows, floor_name(arrow), "latency",
                        partial(floor_latency, cfg, spark, rate=args.rate, seconds=args.seconds,
                                aggregates=latency_aggregates, arrow=arrow), **latency_context)
            if not args.no_throughput:
                m = commands_for(latency_aggregates, args.commands)
                attempt(rows, floor_name(arrow), "throughput",
                        partial(floor_throughput, cfg, spark, commands=m, aggregates=latency_aggregates,
                                arrow=arrow), aggregates=latency_aggregates, commands=m)
    finally:
        spark.stop()


def fresh_accounts(bank: Bank) -> Bank:
    """``bank`` with account ids no run used before (the same length): each run's accounts
    are new data subjects, whose keys are made in its warm-up. With the ids of an earlier run,
    the workers' key caches still held that run's keys (deleted from the key table behind
    their back by ``forget_accounts``), so a personal run right after another made no key
    and ran faster than one after a plain run."""
    return attrs.evolve(bank, prefix=f"acc-{os.urandom(4).hex()}-")


def personal_rows(cfg: CqrsConfig, args: argparse.Namespace, rows: list[Row]) -> list[float]:
    """``--personal``: each ``--aggregates`` count, ``--rounds`` pairs of runs of the bank in
    clear and personal, in one Spark session; the ratios personal / plain, pair by pair. The
    order alternates (plain first in odd rounds, personal first in even ones), so that what a
    run leaves behind for the next (a flush, a compaction) is not always charged to the same
    side."""
    plain, personal = personal_banks()
    ratios: list[float] = []
    spark = spark_session(cfg, "cqrs-bench-processor-personal")
    try:
        if args.warm_up:
            print(f"\n== warm-up, not recorded: {WARM_UP_COMMANDS:,} deposits over "
                  f"{WARM_UP_AGGREGATES:,} aggregates, personal fields", flush=True)
            throughput(cfg, spark, WARM_UP_AGGREGATES, WARM_UP_COMMANDS, personal, args.settle)
        for aggregates in args.aggregates:
            m = commands_for(aggregates, args.commands)
            for n in range(args.rounds):
                pair: list[Row] = []
                for bank in (plain, personal) if n % 2 == 0 else (personal, plain):
                    bank = fresh_accounts(bank)
                    attempt(rows, bank.label, "throughput",
                            partial(throughput, cfg, spark, aggregates, m, bank, args.settle),
                            aggregates=aggregates, commands=m)
                    pair.append(rows[-1])
                if n % 2:
                    pair.reverse()  # plain, personal
                if all("commands_per_s" in r for r in pair):
                    ratio = pair[1]["commands_per_s"] / pair[0]["commands_per_s"]
                    ratios.append(ratio)
                    pair[1]["vs_plain"] = round(ratio, 3)
                    print(f"RESULT personal round {n + 1}, {aggregates:,} aggregates: plain "
                          f"{pair[0]['commands_per_s']:,}/s, personal {pair[1]['commands_per_s']:,}/s, "
                          f"ratio {ratio:.3f}", flush=True)
    finally:
        spark.stop()
    return ratios


def with_run_master_key(cfg: CqrsConfig) -> CqrsConfig:
    """``cfg`` with a master key made for this run (the keys it makes are of no use after)."""
    return cfg.with_overrides(personal_data={
        "master_key": base64.b64encode(os.urandom(32)).decode()})


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cfg = load_config()
    if args.personal:
        cfg = with_run_master_key(cfg)
    meta: dict[str, Any] = {"started": dt.datetime.now().isoformat(timespec="seconds"), "machine": machine_summary(cfg),
                            "code": code_version(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    print(f"machine: {meta['machine']['summary']}; code {meta['code']['commit']}"
          f"{' (framework modified)' if meta['code']['framework_modified'] else ''}", flush=True)
    rows: list[Row] = []
    if args.personal:
        try:
            ratios = personal_rows(cfg, args, rows)
        finally:
            remove_fresh(cfg)
        print("\n## Summary\n\n" + summary_table(rows) + "\n", flush=True)
        if ratios:
            print(f"RESULT personal / plain: {', '.join(f'{r:.3f}' for r in ratios)}; mean "
                  f"{statistics.fmean(ratios):.3f}, median {statistics.median(ratios):.3f}",
                  flush=True)
        print(f"figures: {write_results(meta, rows, args.results_dir)}", flush=True)
        return
    if (args.ours or args.floor) and not (args.no_throughput and args.no_latency):
        try:
            spark_rows(cfg, args, rows)
        finally:
            remove_fresh(cfg)
    if args.peers and not args.no_throughput:
        peer_rows(rows, args.peer_aggregates, args.commands, args.peer_snapshot_interval)
    if args.with_kstreams:
        attempt(rows, "kafka streams", "run", partial(kstreams_run, args.kstreams_dir, args.aggregates))
    print("\n## Summary\n\n" + summary_table(rows) + "\n", flush=True)
    path = write_results(meta, rows, args.results_dir)
    print(f"figures: {path}", flush=True)
    if args.plot:
        for png in plot_all(json.loads(path.read_text()), args.img_dir):
            print(f"plot: {png}", flush=True)


if __name__ == "__main__":
    main()
