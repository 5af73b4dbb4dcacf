"""Benchmark of the command client on the real stack: round trips and the results-listener cost.

    python bench/client.py                                  # 1, 4 and 16 clients, routed + broadcast
    python bench/client.py --clients 4 --round-trips 50 --modes routed

The processor runs as a separate process (``cqrs run processor``) on fresh topics, so this
process holds only the clients. For each number of clients N, N ``CommandClient`` objects each
run ``--round-trips`` sequential ``send_and_wait`` deposits on an aggregate of their own (all
clients at once, one thread each). Printed per run:

- round trip p50 / p99 / max: from ``send`` to the result in the caller's hands;
- listener records read vs. own results, summed over the clients: what reply routing saves
  ("routed": each client reads its reply partition; "broadcast": every client reads every
  partition, as it would without reply routing);
- listener CPU: the Python thread time of the listeners (``time.thread_time``), and the whole
  process's CPU (clients, producers, librdkafka threads) over the run.

Needs the local stack (``cqrs dev up``) or CQRS_* settings naming one.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness import fresh_topics, remove_fresh  # noqa: E402

from cqrs.client import CommandClient, Outgoing  # noqa: E402
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.testing.example import Deposit, OpenAccount  # noqa: E402
from cqrs.testing.example_app import app  # noqa: E402

APP_REF = "cqrs.testing.example_app:app"
WAIT_S = 300.0


def start_processor(cfg: CqrsConfig, prefix: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CQRS_KAFKA_TOPIC_PREFIX": prefix,
           "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers}
    checkpoint = cfg.spark.checkpoint_location("bench", prefix + "client-processor")
    with log.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", "run", "processor", APP_REF,
                                 "--checkpoint", checkpoint], env=env, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(cfg: CqrsConfig, n: int, round_trips: int, routed: bool) -> None:
    mode = "routed" if routed else "broadcast"
    cfg = cfg.with_overrides(client={"reply_routing": routed})
    clients = [CommandClient(app, cfg) for _ in range(n)]
    accounts = [f"acc-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    for c, acc in zip(clients, accounts, strict=True):  # warm-up, not timed
        c.send_and_wait(acc, OpenAccount(acc), timeout=WAIT_S)
    before = [c.listener_stats() for c in clients]
    latencies: list[float] = []
    lock = threading.Lock()

    def work(client: CommandClient, acc: str) -> None:
        mine = []
        for _ in range(round_trips):
            started = time.perf_counter()
            client.send_and_wait(acc, Deposit(1), timeout=WAIT_S)
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=work, args=(c, a)) for c, a in zip(clients, accounts, strict=True)]
    cpu0, wall0 = cpu_s(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu, wall = cpu_s() - cpu0, time.perf_counter() - wall0
    after = [c.listener_stats() for c in clients]
    for c in clients:
        c.close()
    read = sum(a.records_read - b.records_read for a, b in zip(after, before, strict=True))
    own = sum(a.records_matched - b.records_matched for a, b in zip(after, before, strict=True))
    listener_cpu = sum(a.cpu_seconds - b.cpu_seconds for a, b in zip(after, before, strict=True))
    latencies.sort()
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)]
    print(f"RESULT clients={n} mode={mode} round_trips={len(latencies)} wall_s={wall:.1f} "
          f"p50_s={statistics.median(latencies):.3f} p99_s={p99:.3f} max_s={latencies[-1]:.3f} "
          f"records_read={read} own={own} read_per_own={read / max(own, 1):.2f} "
          f"listener_cpu_ms={listener_cpu * 1000:.0f} "
          f"listener_cpu_us_per_read={listener_cpu * 1e6 / max(read, 1):.0f} "
          f"process_cpu_s={cpu:.2f} ({100 * cpu / wall:.1f}% of one core)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="*", default=[1, 4, 16])
    parser.add_argument("--round-trips", type=int, default=20, help="per client")
    parser.add_argument("--modes", nargs="*", choices=["routed", "broadcast"],
                        default=["routed", "broadcast"])
    args = parser.parse_args()

    cfg = load_config()
    prefix = fresh_topics(cfg, app.name, "client").base.removesuffix(app.name)  # removed at the end
    cfg = cfg.with_overrides(kafka={"topic_prefix": prefix})
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"Spark master {cfg.spark.master}, {cfg.kafka.default_partitions} results partitions",
          flush=True)
    log = Path(f"/tmp/{prefix}processor.log")
    processor = start_processor(cfg, prefix, log)
    try:
        with CommandClient(app, cfg) as probe:  # wait until the processor answers
            started = time.perf_counter()
            probe.send_many([Outgoing("warm-up", OpenAccount("x"))])[0].result(WAIT_S)
            print(f"processor answering after {time.perf_counter() - started:.0f} s "
                  f"(log: {log})", flush=True)
        for n in args.clients:
            for mode in args.modes:
                run(cfg, n, args.round_trips, routed=mode == "routed")
    finally:
        os.killpg(processor.pid, 15)
        processor.wait(timeout=120)
        remove_fresh(cfg)


if __name__ == "__main__":
    main()
