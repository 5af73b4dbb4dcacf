"""The Python peer of the command processor: the ``eventsourcing`` library (PyPI
``eventsourcing``, the ``bench`` extra) doing the same bank job in one process. Prints figures.

    python bench/peers.py                                   # SQLite and POPO, 1,000 and 100,000 aggregates
    python bench/peers.py --persistence sqlite --aggregates 1000 --commands 1000 --json

The job, as ``bench/processor.py`` does it: open N accounts (not timed), then M deposits
spread evenly (deposit n goes to account ``n % N``, amount ``1 + n % 100``); each deposit is a
command of the application: load the account through the application's repository, call the
decision method, save. The figure is M / (first deposit started -> last deposit saved).

Configured as a user after speed would: the repository's aggregate cache holds every account
(``AGGREGATE_CACHE_MAXSIZE=0``, unbounded) and is not fast-forwarded from the store on each
load (``AGGREGATE_CACHE_FASTFORWARD=n``: one application instance is the only writer, as one
processor task owns its aggregates), so a load is a cache hit plus the library's defensive
deep copy and a save is one transaction appending one event. ``--snapshot-interval`` adds the
library's snapshots (off by default: with every account cached they are only extra writes).
Persistence: ``sqlite`` (a database file in a temporary folder, the library's SQLite
recorder, one transaction per save) or ``popo`` (the library's in-memory recorder).

Each configuration runs in its own fresh process when run by ``bench/processor.py`` (``--json``
prints one JSON line with the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event

from procmem import MachineCpu

__all__ = ["Bank", "BankAccount", "run_bank", "run_peer_process"]

PERSISTENCE = {"sqlite": "eventsourcing.sqlite", "popo": "eventsourcing.popo"}


class BankAccount(Aggregate):
    """The bank account of ``cqrs.testing.example``: opened with an owner, deposits add up."""

    @event("Opened")
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.balance = 0

    def deposit(self, amount: int) -> None:
        """The decision: reject a non-positive amount, else record the deposit."""
        if amount <= 0:
            raise ValueError("amount must be positive")
        self._deposited(amount)

    @event("Deposited")
    def _deposited(self, amount: int) -> None:
        self.balance += amount


class Bank(Application[UUID]):
    """The application: one method per command, each a load, a decision and a save."""

    def open_account(self, owner: str) -> UUID:
        account = BankAccount(owner)
        self.save(account)
        return account.id

    def deposit(self, account_id: UUID, amount: int) -> None:
        account: BankAccount = self.repository.get(account_id)
        account.deposit(amount)
        self.save(account)

    def balance(self, account_id: UUID) -> int:
        return self.repository.get(account_id).balance


def bank_env(persistence: str, db_path: str | None, snapshot_interval: int) -> dict[str, str]:
    """The application's environment for one configuration (see the module's docstring)."""
    env = {
        "PERSISTENCE_MODULE": PERSISTENCE[persistence],
        "AGGREGATE_CACHE_MAXSIZE": "0",  # unbounded: every account stays cached
        "AGGREGATE_CACHE_FASTFORWARD": "n",  # the only writer: no store query per load
    }
    if persistence == "sqlite":
        env["SQLITE_DBNAME"] = db_path or ":memory:"
    if snapshot_interval:
        env["IS_SNAPSHOTTING_ENABLED"] = "y"
    return env


def _bank_class(snapshot_interval: int) -> type[Bank]:
    if not snapshot_interval:
        return Bank
    return type("SnapshottingBank", (Bank,), {"snapshotting_intervals": {BankAccount: snapshot_interval}})


def run_bank(persistence: str, aggregates: int, commands: int, snapshot_interval: int = 0) -> dict[str, Any]:
    """Open ``aggregates`` accounts, then time ``commands`` deposits; the figures as a dict."""
    with tempfile.TemporaryDirectory(prefix="bench-eventsourcing-") as tmp:
        db_path = str(Path(tmp) / "bank.sqlite") if persistence == "sqlite" else None
        bank = _bank_class(snapshot_interval)(env=bank_env(persistence, db_path, snapshot_interval))
        opened_at = time.monotonic()
        ids = [bank.open_account(f"owner {a}") for a in range(aggregates)]
        open_s = time.monotonic() - opened_at
        work = [(ids[n % aggregates], 1 + n % 100) for n in range(commands)]  # before the clock
        cpu = MachineCpu()
        started = time.monotonic()
        for account_id, amount in work:
            bank.deposit(account_id, amount)
        elapsed = time.monotonic() - started
        machine = cpu.percent()
        expected = sum(1 + n % 100 for n in range(commands) if n % aggregates == 0)
        if bank.balance(ids[0]) != expected:
            raise AssertionError(f"account 0 holds {bank.balance(ids[0])}, expected {expected}")
        db_mib = Path(db_path).stat().st_size / 2**20 if db_path else 0.0
        bank.close()
    return {
        "system": f"eventsourcing {persistence}", "kind": "throughput", "aggregates": aggregates,
        "commands": commands, "seconds": round(elapsed, 3), "commands_per_s": round(commands / elapsed),
        "open_seconds": round(open_s, 3), "machine_pct": machine, "snapshot_interval": snapshot_interval,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "db_mib": round(db_mib, 1),
        "library": f"eventsourcing {_version()}",
    }


def _version() -> str:
    from importlib.metadata import version

    return version("eventsourcing")


def run_peer_process(persistence: str, aggregates: int, commands: int, snapshot_interval: int = 0,
                     timeout_s: float = 3600) -> dict[str, Any]:
    """:func:`run_bank` in a fresh interpreter (no heap or GC state carried over from the
    caller, which may hold a million encoded commands); its JSON line as a dict."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--persistence", persistence,
           "--aggregates", str(aggregates), "--commands", str(commands),
           "--snapshot-interval", str(snapshot_interval)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--persistence", nargs="*", choices=sorted(PERSISTENCE), default=["sqlite", "popo"])
    parser.add_argument("--aggregates", type=int, nargs="*", default=[1000, 100_000])
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--snapshot-interval", type=int, default=0,
                        help="take a snapshot every N events of an account (0: none)")
    parser.add_argument("--json", action="store_true", help="print one JSON line per run, nothing else")
    args = parser.parse_args()
    if not args.json:
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"eventsourcing {_version()}", flush=True)
    for persistence in args.persistence:
        for aggregates in args.aggregates:
            row = run_bank(persistence, aggregates, args.commands, args.snapshot_interval)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"RESULT {row['system']} aggregates={aggregates} commands={row['commands']} "
                      f"seconds={row['seconds']:.1f} commands_per_s={row['commands_per_s']:,} "
                      f"(opening took {row['open_seconds']:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
