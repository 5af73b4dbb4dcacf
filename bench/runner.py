"""The in-process runner (``cqrs.testing.runner.LocalRunner``) on the bank job, beside the
``eventsourcing`` library's in-memory application doing the same job, in the same run.

    python bench/runner.py                         # 1,000 aggregates, 100,000 deposits
    python bench/runner.py --aggregates 1000 100000 --commands 100000

The job is ``bench/peers.py``'s: open N accounts (not timed), then M deposits spread evenly
(deposit n to account ``n % N``, amount ``1 + n % 100``). The runner is timed two ways:
``batch`` sends every deposit, then runs until all are answered (as commands wait on a topic
and the processor takes them in chunks); ``one by one`` is ``send_and_wait`` per deposit, as a
test that checks each answer does. Every command goes through the Avro codec, the processor's
step (dedup memory, expected versions) and the result encoding, as on the real stack. The peer
(``eventsourcing``, POPO recorder, every account cached) runs in a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cqrs.testing.example import Deposit, OpenAccount  # noqa: E402
from cqrs.testing.example_app import app  # noqa: E402
from cqrs.testing.runner import LocalRunner  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def run_runner(aggregates: int, commands: int, one_by_one: bool) -> dict[str, Any]:
    runner = LocalRunner(app)
    ids = [f"acc-{a}" for a in range(aggregates)]
    for i in ids:
        runner.send(i, OpenAccount(f"owner {i}"))
    runner.run()
    work = [(ids[n % aggregates], Deposit(1 + n % 100)) for n in range(commands)]
    started = time.perf_counter()
    if one_by_one:
        for account, cmd in work:
            runner.send_and_wait(account, cmd)
    else:
        for account, cmd in work:
            runner.send(account, cmd)
        runner.run()
    elapsed = time.perf_counter() - started
    expected = sum(1 + n % 100 for n in range(commands) if n % aggregates == 0)
    balance = runner.state(ids[0]).balance
    if balance != expected:
        raise AssertionError(f"account 0 holds {balance}, expected {expected}")
    return {"system": f"LocalRunner {'one by one' if one_by_one else 'batch'}",
            "aggregates": aggregates, "commands": commands, "seconds": round(elapsed, 3),
            "commands_per_s": round(commands / elapsed)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aggregates", type=int, nargs="+", default=[1000])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--no-peer", action="store_true",
                        help="the runner alone (the peer needs pip install -e '.[bench]')")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON results")
    args = parser.parse_args(argv)
    rows = []
    for n in args.aggregates:
        load = [round(x, 2) for x in os.getloadavg()]
        print(f"\n== {n:,} aggregates, {args.commands:,} deposits (load average {load})", flush=True)
        runs = [lambda: run_runner(n, args.commands, False), lambda: run_runner(n, args.commands, True)]
        if not args.no_peer:
            from peers import run_peer_process  # needs the bench extra: pip install -e '.[bench]'

            runs.append(lambda: run_peer_process("popo", n, args.commands))
        for run in runs:
            row = run()
            row["load"] = load
            rows.append(row)
            print(f"  {row['system']:<26} {row['commands_per_s']:>8,}/s  ({row['seconds']:.1f} s)",
                  flush=True)
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"runner-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"meta": {"bench": "runner", "argv": sys.argv[1:],
                                        "machine": platform.node(), "cpus": os.cpu_count()},
                               "rows": rows}, indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
