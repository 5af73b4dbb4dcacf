"""An app whose projection handler fails while a flag file says so, for
tests/integration/test_projection_retries.py.

A ``Counted`` event names a flag file; the ``tallies`` handler fails while the file holds a
count above 0 (and counts it down), and appends its time to ``<flag>.calls``. Files, because
the handler runs in Spark's Python workers and in the projector's driver (the retries), other
processes than the test's. Imported by reference (``flaky_projection_app:app``) with this
folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import fcntl
import time
from pathlib import Path

from cqrs.app import App
from cqrs.domain import Aggregate, event
from cqrs.retries import Backoff, RetryPolicy
from projections import Projection

__all__ = ["BACKOFF", "Counted", "Tallies", "Tally", "TallyUnavailable", "app"]

BACKOFF = Backoff(initial_s=1.0, multiplier=2.0, max_s=4.0, jitter=0.2, max_attempts=4)


class TallyUnavailable(Exception):
    """The stand-in service the handler asks is down."""


@event(name="flakyproj.Counted")
class Counted:
    n: int
    flag: str  # path of the flag file ("" : never fails)


class Tally(Aggregate, name="flakyproj.Tally"):
    total: int = 0

    def apply_counted(self, e: Counted) -> None:
        self.total += e.n


def call_service(flag: str) -> None:
    """Fails while the flag file holds a count above 0 (and counts it down)."""
    if not flag:
        return
    path = Path(flag)
    with open(path.with_suffix(".calls"), "a") as calls:
        calls.write(f"{time.time():.3f}\n")
    if not path.exists():
        return
    with open(path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        left = int(f.read().strip() or "0")
        if left > 0:
            f.seek(0)
            f.truncate()
            f.write(str(left - 1))
            raise TallyUnavailable(f"tally service down ({left} more failures)")


class Tallies(Projection):
    name = "tallies"
    aggregate = Tally
    key = "tally_id"
    columns = {"total": int, "events": int}
    defaults = {"total": 0, "events": 0}

    def on_counted(self, view: dict, e: Counted) -> None:
        call_service(e.flag)
        view["total"] += e.n
        view["events"] += 1


app = App("flakyproj", aggregates=[Tally], handlers=[], projections=[Tallies],
          retries=RetryPolicy(projections=BACKOFF))
