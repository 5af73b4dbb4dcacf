"""An app whose handler takes as long as its command says (a slow payment gateway, a hung
call), for tests/integration/test_lanes.py and the bad-inputs catalogue. Imported by
reference (``slow_app:app``) with this folder on ``PYTHONPATH``."""

from __future__ import annotations

import time

from cqrs.app import App
from cqrs.domain import Aggregate, CommandHandler, command, event

__all__ = ["Spin", "Tick", "Ticked", "Work", "Worked", "app"]


@command(name="slow.Work")
class Work:
    seconds: float  # how long the handler sleeps (blocked in a call: a slow or hung service)


@command(name="slow.Spin")
class Spin:
    seconds: float  # how long the handler computes (a loop that holds the interpreter)


@command(name="slow.Tick")
class Tick:
    n: int


@event(name="slow.Worked")
class Worked:
    seconds: float


@event(name="slow.Ticked")
class Ticked:
    n: int


class Job(Aggregate, name="slow.Job"):
    worked: float = 0.0
    ticks: int = 0

    def apply_worked(self, e: Worked) -> None:
        self.worked += e.seconds

    def apply_ticked(self, e: Ticked) -> None:
        self.ticks += 1


class JobHandler(CommandHandler[Job]):
    def work(self, job: Job, cmd: Work) -> list[Worked]:
        time.sleep(cmd.seconds)
        return [Worked(cmd.seconds)]

    def spin(self, job: Job, cmd: Spin) -> list[Worked]:
        until = time.monotonic() + cmd.seconds
        while time.monotonic() < until:
            pass
        return [Worked(cmd.seconds)]

    def tick(self, job: Job, cmd: Tick) -> list[Ticked]:
        return [Ticked(cmd.n)]


app = App("slow", aggregates=[Job], handlers=[JobHandler])
