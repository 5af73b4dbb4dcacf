"""An app whose handler calls a stand-in service that fails while a flag file says so, for
tests/integration/test_retrier.py.

The flag file (its path is in the command) holds how many more calls fail; each call appends
its time to ``<flag>.calls``. Files, because the handler runs in Spark's Python workers (other
processes). Imported by reference (``flaky_app:app``) with this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

from cqrs.app import App
from cqrs.domain import Aggregate, CommandHandler, Event, command, event
from cqrs.retries import Backoff, RetryPolicy

__all__ = ["BACKOFF", "SLOW_BACKOFF", "Charge", "Charged", "ServiceUnavailable",
           "SlowServiceUnavailable", "app"]

BACKOFF = Backoff(initial_s=1.0, multiplier=2.0, max_s=8.0, jitter=0.2, max_attempts=4)
SLOW_BACKOFF = Backoff(initial_s=6.0, multiplier=2.0, max_s=24.0, jitter=0.2, max_attempts=4)


class ServiceUnavailable(Exception):
    """The stand-in payment service is down (declared transient)."""


class SlowServiceUnavailable(ServiceUnavailable):
    """Down for longer: retried after SLOW_BACKOFF (a flag file whose text ends in "slow")."""


@command(name="flaky.Charge")
class Charge:
    amount: int
    flag: str  # path of the flag file


@event(name="flaky.Charged")
class Charged:
    amount: int


class Wallet(Aggregate, name="flaky.Wallet"):
    total: int = 0

    def apply_charged(self, e: Charged) -> None:
        self.total += e.amount


def call_service(flag: str) -> None:
    """Fails while the flag file holds a count above 0 (and counts it down); a count followed
    by " slow" fails with SlowServiceUnavailable."""
    path = Path(flag)
    with open(path.with_suffix(".calls"), "a") as calls:
        calls.write(f"{time.time():.3f}\n")
    if not path.exists():
        return
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        count, _, kind = (f.read().strip() or "0").partition(" ")
        left = int(count)
        if left > 0:
            f.seek(0)
            f.truncate()
            f.write(f"{left - 1} {kind}".strip())
            error = SlowServiceUnavailable if kind == "slow" else ServiceUnavailable
            raise error(f"payment service down ({left} more failures)")


class WalletHandler(CommandHandler[Wallet]):
    def charge(self, wallet: Wallet, cmd: Charge) -> list[Event]:
        call_service(cmd.flag)
        return [Charged(cmd.amount)]


app = App("flaky", aggregates=[Wallet], handlers=[WalletHandler],
          retries=RetryPolicy(transient=[ServiceUnavailable], default=BACKOFF,
                              by_error={SlowServiceUnavailable: SLOW_BACKOFF}))
