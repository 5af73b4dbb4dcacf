"""Benchmark of deadlines on the real stack: the orders example's payment window, under
``cqrs run app domain_examples.orders:app --no-projectors`` (processor and scheduler), as a
user runs it.

    python bench/deadlines.py                          # 100,000 deadlines at 1,000 due/s, idle cost
    python bench/deadlines.py --count 20000 --kill     # SIGKILL the app while deadlines fire
    python bench/deadlines.py --count 2000 --rate 200 --idle 0     # a smoke run

Firing: ``--count`` orders are placed (commands produced ahead of time, each stamped so that
its payment window ends at a chosen time: the deadlines fall due ``--rate`` per second, starting
``--lead`` seconds after the commands are sent); every tenth order is paid before its window
ends, which cancels its deadline. A consumer notes when each deadline command's result arrives
(command ids ``dl:orders.Order:<id>:orders.CancelUnpaidOrder:<due ms>``). Checked: every unpaid
order's deadline is answered exactly once (answers given again, marked ``cqrs.duplicate``, are
counted apart: they are the processor's dedup at work), no paid order's deadline fires.
Lateness = result arrival - due time. With ``--kill``, the app is killed with SIGKILL (its whole
process group) halfway through the firing and started again.

Idle (``--idle N``, default 1,000,000): N deadlines due in a day are written straight into the
deadline tables of a fresh app name, then ``cqrs run scheduler`` runs over them for
``--idle-seconds``; its CPU (process and children, from /proc) over that time is the idle cost.

Prints the figures and writes them to ``bench/results/deadlines-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from conversations import percentiles, tree_cpu_s  # noqa: E402
from harness import Encoded, ResultWatcher, announce, fresh_topics, produce, remove_fresh  # noqa: E402

from cqrs.client import encode_command  # noqa: E402
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from domain_examples.orders import OrderLine, PayOrder, PlaceOrder, app  # noqa: E402

APP_REF = "domain_examples.orders:app"
RESULTS = ROOT / "bench" / "results"
LINES = (OrderLine("sku-1", 1, 1000),)
DUPLICATE = ("cqrs.duplicate", b"1")


def start_app(cfg: CqrsConfig, prefix: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CQRS_KAFKA_TOPIC_PREFIX": prefix,
           "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": str(log.parent / f"ck-{prefix}"), "CQRS_METRICS_PORT": "0"}
    sink = log.open("ab")
    return subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", *args], env=env, stdout=sink,
                            stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes], kill: bool = False) -> None:
    if kill:
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class Fired(ResultWatcher):
    """Results of deadline commands: first arrival per id, and answers given again counted."""

    def __init__(self, cfg: CqrsConfig, topic: str) -> None:
        super().__init__(cfg, topic)
        self.again: dict[bytes, int] = {}
        self.firsts: dict[bytes, int] = {}  # results not marked as given again, per id

    def run(self) -> None:
        from cqrs.kafka_io import take

        while not self.stopped.is_set():
            for msg in take(self.consumer, 5000, 0.2):
                key = msg.key()
                if msg.error() is not None or not key or not key.startswith(b"dl:"):
                    continue
                now = time.time()
                with self.lock:
                    if DUPLICATE in (msg.headers() or []):
                        self.again[key] = self.again.get(key, 0) + 1
                        continue
                    self.firsts[key] = self.firsts.get(key, 0) + 1
                    if key not in self.arrived:
                        self.arrived[key] = now
                        self.pending.discard(key)
        self.consumer.close()


def firing(cfg: CqrsConfig, count: int, rate: float, lead_s: float, kill: bool,
           watch_after_s: float = 5.0) -> dict[str, Any]:
    topics = fresh_topics(cfg, app.name, "deadlines")
    prefix = topics.base.removesuffix(app.name)
    cfg = cfg.with_overrides(kafka={"topic_prefix": prefix})
    log = Path(cfg.dev.home_path) / "logs" / f"bench-deadlines-{prefix.strip('-')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"cqrs run app {APP_REF} --no-projectors on {prefix}*; log {log}", flush=True)
    args = ("run", "app", APP_REF, "--no-projectors")
    proc = start_app(cfg, prefix, log, *args)
    watcher = Fired(cfg, topics.results)
    watcher.start()
    try:
        # warm up: the first command waits for Spark to start
        warm = encode_command(app, "warm-up", PlaceOrder("c", LINES, dt.datetime.now(dt.timezone.utc), 86400))
        produce(cfg, topics.commands, [Encoded(warm[0].encode(), warm[1], warm[2], list(warm[3]))])
        from harness import ResultWatcher as Plain

        plain = Plain(cfg, topics.results)
        plain.start()
        plain.wait_for([warm[0].encode()], 600, "warm-up")
        # the orders, stamped so that their windows end `rate` per second from due0 on
        window_s = 3600
        now = dt.datetime.now(dt.timezone.utc)
        due0 = now + dt.timedelta(seconds=lead_s)
        stamps = [due0 - dt.timedelta(seconds=window_s) + dt.timedelta(seconds=i / rate)
                  for i in range(count)]
        orders = [f"o-{i}" for i in range(count)]
        placed = [encode_command(app, o, PlaceOrder("c", LINES, ts, window_s), timestamp=ts)
                  for o, ts in zip(orders, stamps, strict=True)]
        paid = set(orders[::10])
        pays = [encode_command(app, o, PayOrder(1000, "p")) for o in orders[::10]]
        due_ms = {o: int((ts + dt.timedelta(seconds=window_s)).timestamp() * 1000)
                  for o, ts in zip(orders, stamps, strict=True)}
        expected = {f"dl:orders.Order:{o}:orders.CancelUnpaidOrder:{due_ms[o]}".encode(): o
                    for o in orders if o not in paid}
        cancelled = {f"dl:orders.Order:{o}:orders.CancelUnpaidOrder:{due_ms[o]}".encode()
                     for o in paid}
        load = announce(f"{count:,} orders placed, {len(paid):,} paid; deadlines due from "
                        f"{due0:%H:%M:%S} at {rate:g}/s")
        t0 = time.monotonic()
        produce(cfg, topics.commands, [Encoded(c.encode(), k, v, list(h)) for c, k, v, h in placed])
        plain.wait_for([c.encode() for c, *_ in placed], 900, "orders placed")
        produce(cfg, topics.commands, [Encoded(c.encode(), k, v, list(h)) for c, k, v, h in pays])
        plain.wait_for([c.encode() for c, *_ in pays], 900, "orders paid")
        plain.stop()
        placed_s = time.monotonic() - t0
        print(f"  placed and paid in {placed_s:.1f} s; "
              f"{(due0 - dt.datetime.now(dt.timezone.utc)).total_seconds():.1f} s before the first is due",
              flush=True)
        killed_at = None
        if kill:
            half = due0 + dt.timedelta(seconds=count / rate / 2)
            time.sleep(max(0.0, (half - dt.datetime.now(dt.timezone.utc)).total_seconds()))
            stop(proc, kill=True)
            killed_at = time.time()
            print(f"  SIGKILL at {dt.datetime.now(dt.timezone.utc):%H:%M:%S}; starting it again", flush=True)
            proc = start_app(cfg, prefix, log, *args)
        last_due = max(due_ms.values()) / 1000
        watcher.wait_for(list(expected), max(600.0, last_due - time.time() + 600), "deadlines fired")
        time.sleep(watch_after_s)  # anything fired twice or wrongly would show by now
        with watcher.lock:
            firsts, again = dict(watcher.firsts), dict(watcher.again)
            arrived = dict(watcher.arrived)
        late = [arrived[k] - due_ms[o] / 1000 for k, o in expected.items()]
        row: dict[str, Any] = {
            "count": count, "rate": rate, "lead_s": lead_s, "kill": kill, "load": load,
            "placed_and_paid_s": placed_s,
            "fired": len([k for k in expected if k in firsts]),
            "expected": len(expected),
            "answered_more_than_once": sum(1 for k in expected if firsts.get(k, 0) > 1),
            "answered_again_marked": sum(again.values()),
            "cancelled_fired": len(cancelled & set(firsts)),
            "unexpected": len(set(firsts) - set(expected)),
            "lateness": {k: round(v, 1) for k, v in percentiles(late).items()},
            "load_after": [round(x, 2) for x in os.getloadavg()],
        }
        if killed_at is not None:
            row["killed_at_fraction"] = 0.5
        return row
    finally:
        watcher.stop()
        stop(proc)
        remove_fresh(cfg)


def idle(cfg: CqrsConfig, pending: int, seconds: float, start_s: float = 15.0) -> dict[str, Any]:
    from cqrs.scheduler.records import StoredDeadline
    from cqrs.scheduler.store import open_deadline_store

    prefix = f"bench-idle-{uuid.uuid4().hex[:8]}-"
    cfg = cfg.with_overrides(kafka={"topic_prefix": prefix})
    fresh_topics(cfg, app.name, "idle")  # topics of its own, removed at the end
    base = prefix + app.name
    store = open_deadline_store(cfg, base)
    due = int(time.time() * 1000) + 86_400_000
    t0 = time.monotonic()
    announce(f"writing {pending:,} pending deadlines due in a day")
    try:
        batch = 20_000
        for start in range(0, pending, batch):
            store.apply([StoredDeadline(f"orders.Order:idle-{i}", "orders.CancelUnpaidOrder",
                                        due + i, "orders.Order", f"idle-{i}", f"dl:{i}", b"k", b"v",
                                        None, "orders.CancelUnpaidOrder")
                         for i in range(start, min(pending, start + batch))])
            if start and start % 200_000 == 0:
                print(f"  {start:,} written ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        store.close()
    written_s = time.monotonic() - t0
    log = Path(cfg.dev.home_path) / "logs" / f"bench-deadlines-idle-{prefix.strip('-')}.log"
    env_cfg = cfg.with_overrides(kafka={"topic_prefix": prefix})
    proc = start_app(env_cfg, prefix, log, "run", "scheduler", APP_REF)
    try:
        time.sleep(start_s)  # past its start (imports, Cassandra and Kafka connections)
        load = announce(f"cqrs run scheduler over {pending:,} pending deadlines, none due, "
                        f"for {seconds:g} s")
        cpu0, t1 = tree_cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu = tree_cpu_s(proc.pid) - cpu0
        wall = time.monotonic() - t1
    finally:
        stop(proc)
        remove_fresh(cfg)
    return {"pending": pending, "written_s": written_s, "seconds": wall, "load": load,
            "scheduler_cpu_fraction_of_a_core": cpu / wall}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="orders (deadlines) placed")
    parser.add_argument("--rate", type=float, default=1000.0, help="deadlines due per second")
    parser.add_argument("--lead", type=float, default=None,
                        help="seconds from sending the orders to the first due time "
                        "(default: 30 + count / 5,000)")
    parser.add_argument("--kill", action="store_true", help="SIGKILL the app halfway through firing")
    parser.add_argument("--idle", type=int, default=1_000_000, help="pending deadlines for the idle "
                        "cost (0: skip)")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--idle-start", type=float, default=15.0,
                        help="seconds the scheduler is given to start before its CPU is counted "
                             "(imports, Cassandra and Kafka connections; default 15)")
    parser.add_argument("--watch-after", type=float, default=5.0,
                        help="seconds the results are still watched once every deadline fired, "
                             "for any fired twice or wrongly (default 5)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS,
                        help="folder of the JSON results (default bench/results)")
    parser.add_argument("--no-firing", action="store_true", help="only the idle cost")
    args = parser.parse_args(argv)
    cfg = load_config()
    started = time.strftime("%Y%m%d-%H%M%S")
    rows: dict[str, Any] = {}
    if not args.no_firing:
        lead = args.lead if args.lead is not None else 30 + args.count / 5000
        rows["firing"] = firing(cfg, args.count, args.rate, lead, args.kill, args.watch_after)
        print(json.dumps(rows["firing"], indent=1), flush=True)
    if args.idle:
        rows["idle"] = idle(cfg, args.idle, args.idle_seconds, args.idle_start)
        print(json.dumps(rows["idle"], indent=1), flush=True)
    meta = {"bench": "deadlines", "time": started, "argv": sys.argv[1:], "machine": platform.node(),
            "cpus": os.cpu_count()}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"deadlines-{started}.json"
    out.write_text(json.dumps({"meta": meta, **rows}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
