"""Benchmark of conversations between aggregates on the real stack: the lending example under
``cqrs run app``, as a user runs it.

    python bench/conversations.py                        # one at a time, 10/s and 50/s
    python bench/conversations.py --rates 0 50 --count 300

A conversation: ``RequestLoan`` to a book -> the ``lending`` process manager -> ``ReserveLoanSlot``
at the member -> ``ConfirmLoan`` at the book -> ``BookLent``, which ends it (two hops through the
process manager, two commands). Each is timed from the ``RequestLoan`` result in the client's
hands (start) to its outcome in the hands of ``CommandClient.wait_conversation`` (end).
Conversations start one at a time (rate 0: the next once the last ended) or at a fixed rate
(each in a thread of its own), on fresh books, three per member so that every one ends lent.

In the same run, before the conversations, a single command's round trip (``send_and_wait``
of ``AddBook`` to a new book, one at a time) for comparison; and from the app's status JSON, the
CPU the process managers' reacting threads spent per reacted event, and the whole app's CPU
(``cqrs run app`` and its Spark workers) per conversation.

Prints the figures, writes them to ``bench/results/conversations-<time>.json`` and, with
matplotlib (``pip install -e '.[bench]'``), a plot to ``docs/img/conversations.png``.
Needs the local stack (``cqrs dev up``) or CQRS_* settings naming one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness import announce, fresh_topics, remove_fresh  # noqa: E402

from cqrs.client import CommandClient  # noqa: E402
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from domain_examples.lending import (  # noqa: E402
    MAX_LOANS, AddBook, BookLent, RegisterMember, RequestLoan, app,
)

APP_REF = "domain_examples.lending:app"
RESULTS = ROOT / "bench" / "results"
IMG = ROOT / "docs" / "img" / "conversations.png"


def percentiles(values: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max in milliseconds (p99 as ``sorted[int(n * 0.99) - 1]``, as the other
    benches compute it)."""
    s = sorted(values)

    def at(q: float) -> float:
        return s[max(0, int(len(s) * q) - 1)] * 1000.0

    return {"n": len(s), "p50_ms": statistics.median(s) * 1000.0, "p90_ms": at(0.90),
            "p99_ms": at(0.99), "max_ms": s[-1] * 1000.0}


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and every descendant alive now."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid = int(fields[1])
        children.setdefault(ppid, []).append(int(entry.name))
        stats[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, 0.0)
        todo += children.get(p, [])
    return total


class App:
    """``cqrs run app`` of the lending example on fresh topics, in its own process group."""

    def __init__(self, cfg: CqrsConfig, prefix: str, port: int, log: Path) -> None:
        self.port = port
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CQRS_KAFKA_TOPIC_PREFIX": prefix,
               "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
               "CQRS_SPARK_CHECKPOINT_DIR": str(log.parent / f"ck-{prefix}"),
               "CQRS_METRICS_PORT": str(port)}
        self.sink = log.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", "run", "app", APP_REF],
                                     env=env, stdout=self.sink, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status.json", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def wait_active(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"cqrs run app exited with {self.proc.returncode}")
            try:
                if all(q["state"] == "active" for q in self.status()["queries"]):
                    return
            except OSError:
                pass
            time.sleep(1)
        raise SystemExit("cqrs run app did not become active in time")

    def stop(self) -> None:
        import signal

        self.proc.send_signal(signal.SIGTERM)  # the cqrs process only: it stops between batches
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.sink.close()


class Library:
    """Members and books made ahead of time: each conversation takes a fresh book and a member
    with a free slot (three conversations per member: every one ends with ``BookLent``)."""

    def __init__(self, client: CommandClient, count: int, run: str) -> None:
        members = [f"m-{run}-{i}" for i in range((count + MAX_LOANS - 1) // MAX_LOANS)]
        self.pairs = [(f"b-{run}-{i}", members[i // MAX_LOANS]) for i in range(count)]
        futures = [client.send(m, RegisterMember(m)) for m in members]
        futures += [client.send(b, AddBook(b)) for b, _ in self.pairs]
        for f in futures:
            assert f.result(timeout=300).accepted
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[str, str]:
        with self._lock:
            pair = self.pairs[self._next]
            self._next += 1
            return pair


def conversation(client: CommandClient, book: str, member: str) -> float:
    started = client.send_and_wait(book, RequestLoan(member), timeout=120)
    assert started.accepted, started
    t0 = time.perf_counter()
    _, event = client.wait_conversation(started.command_id, timeout=120)
    elapsed = time.perf_counter() - t0
    assert isinstance(event, BookLent), event
    return elapsed


def single_commands(client: CommandClient, count: int, run: str) -> list[float]:
    out = []
    for i in range(count):
        t0 = time.perf_counter()
        assert client.send_and_wait(f"single-{run}-{i}", AddBook("t"), timeout=120).accepted
        out.append(time.perf_counter() - t0)
    return out


def at_rate(client: CommandClient, library: Library, rate: float, count: int) -> list[float]:
    """Conversations started every 1/rate s (open loop), each in a thread of its own."""
    times: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            elapsed = conversation(client, *library.take())
            with lock:
                times.append(elapsed)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = []
    t0 = time.perf_counter()
    for i in range(count):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        th = threading.Thread(target=one, daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(300)
    if errors:
        raise errors[0]
    return times


def counters(app_proc: App) -> dict[str, float]:
    return app_proc.status().get("counters", {})  # type: ignore[no-any-return]


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (pip install -e '.[bench]')")
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for row in rows:
        s = sorted(row["samples_ms"])
        ys = [(i + 1) / len(s) * 100.0 for i in range(len(s))]
        ax.step(s, ys, where="post", label=f"{row['label']} (p50 {row['p50_ms']:.0f} ms, "
                f"p99 {row['p99_ms']:.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("milliseconds (log)")
    ax.set_ylabel("% of conversations / commands done")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0, 10, 50],
                        help="conversations per second (0: one at a time); default 0 10 50")
    parser.add_argument("--count", type=int, default=200, help="conversations per rate")
    parser.add_argument("--singles", type=int, default=200, help="single-command round trips")
    parser.add_argument("--warm-up", type=int, default=30,
                        help="untimed conversations first (JVMs and Python warm up under load)")
    parser.add_argument("--port", type=int, default=18093, help="the app's metrics port")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--img", type=Path, default=IMG, help="the plot's file (default "
                        "docs/img/conversations.png)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS,
                        help="folder of the JSON results (default bench/results)")
    args = parser.parse_args(argv)

    cfg = load_config()
    run = uuid.uuid4().hex[:6]
    topics = fresh_topics(cfg, app.name, "conv")
    prefix = topics.base.removesuffix(app.name)
    cfg = cfg.with_overrides(kafka={"topic_prefix": prefix})
    log = Path(cfg.dev.home_path) / "logs" / f"bench-conversations-{run}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"cqrs run app {APP_REF} on topics {prefix}*; its log: {log}")
    proc = App(cfg, prefix, args.port, log)
    rows: list[dict[str, Any]] = []
    started_at = time.strftime("%Y%m%d-%H%M%S")
    try:
        proc.wait_active()
        total = args.warm_up + args.count * len(args.rates)
        with CommandClient(app, cfg) as client:
            library = Library(client, total, run)
            for _ in range(args.warm_up):
                conversation(client, *library.take())
            load = announce("single command round trip (send_and_wait), one at a time")
            singles = single_commands(client, args.singles, run)
            row = {"label": "one command", "rate": 0, "load": load,
                   **percentiles(singles), "samples_ms": [x * 1000 for x in singles]}
            rows.append(row)
            print({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()
                   if k != "samples_ms"})
            for rate in args.rates:
                label = "one at a time" if rate == 0 else f"{rate:g}/s"
                load = announce(f"conversations, {label}, {args.count} of them")
                before, cpu0, t0 = counters(proc), tree_cpu_s(proc.proc.pid), time.perf_counter()
                if rate == 0:
                    times = [conversation(client, *library.take()) for _ in range(args.count)]
                else:
                    times = at_rate(client, library, rate, args.count)
                wall = time.perf_counter() - t0
                cpu = tree_cpu_s(proc.proc.pid) - cpu0
                time.sleep(1.5)  # the process managers' counters are reported once a second
                after = counters(proc)
                reactions = after.get("reactions", 0) - before.get("reactions", 0)
                pm_cpu = after.get("reaction_cpu_s", 0) - before.get("reaction_cpu_s", 0)
                row = {"label": f"conversation, {label}", "rate": rate, "load": load,
                       **percentiles(times), "wall_s": wall, "reactions": reactions,
                       "pm_cpu_us_per_reaction": pm_cpu / reactions * 1e6 if reactions else None,
                       "app_cpu_ms_per_conversation": cpu / len(times) * 1000,
                       "app_cpu_cores": cpu / wall,
                       "samples_ms": [x * 1000 for x in times]}
                rows.append(row)
                print({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()
                       if k != "samples_ms"})
    finally:
        proc.stop()
        remove_fresh(cfg)
    meta = {"bench": "conversations", "time": started_at, "argv": sys.argv[1:],
            "machine": platform.node(), "cpus": os.cpu_count(),
            "load_after": [round(x, 2) for x in os.getloadavg()]}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / f"conversations-{started_at}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nresults: {out}")
    if not args.no_plot:
        path = plot(rows, args.img, f"lending conversations under `cqrs run app` ({started_at}, "
                    f"{os.cpu_count()} cores)")
        if path:
            print(f"plot: {path}")


if __name__ == "__main__":
    main()
