"""Time budgets for decisions: what watches a decision running in another thread, and what
abandons one that runs past its budget.

A decision (a command's handler and appliers, a process manager's reaction) is user code that
may block or loop. It runs in a thread of its own while the caller watches a :class:`Watch`
the deciding code keeps up to date (which item it is on, since when); past the budget the
caller abandons that thread (whatever it returns is dropped), asks it to stop
(:func:`interrupt`), answers the item as timed out, and goes on in a new thread. The
processor's lanes (:mod:`cqrs.processor.lanes`) and the process managers' job
(:class:`BudgetedThread`) use it.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from cqrs.errors import DecisionTimeoutError

__all__ = ["WATCH_S", "BudgetedThread", "Guard", "Watch", "interrupt"]

WATCH_S = 0.05  # how often a watching thread looks at a running decision, at most


class Watch:
    """Which item a thread is deciding and since when (``time.monotonic()``), for a watchdog in
    another thread: the deciding code sets it as it takes each item, and clears ``record``."""

    __slots__ = ("record", "since")

    def __init__(self) -> None:
        self.record: Any = None
        self.since = 0.0

    def start(self, record: Any) -> None:
        self.record, self.since = record, time.monotonic()

    def over(self, budget_s: float, now: float) -> Any:
        """The item being decided if it has run past ``budget_s``, else None."""
        record = self.record
        if record is None or budget_s <= 0 or now - self.since <= budget_s:
            return None
        return record


class Guard:
    """What a loop of decisions (e.g. a projection's handlers over a batch of events) calls
    before each item: :meth:`enter` notes the item in ``watch``, and fails an item that ran
    past the budget before (``timed_out``, by ``key(item)``) at once, with
    :class:`~cqrs.errors.DecisionTimeoutError`, instead of running it again; ``describe(item)``
    names the item in that error (called only then: :meth:`enter` runs once per event of a
    rebuild). ``cancelled`` is set when the caller abandoned the call: it must then write
    nothing."""

    __slots__ = ("cancelled", "describe", "key", "timed_out", "watch")

    def __init__(self, timed_out: Mapping[Hashable, float], key: Callable[[Any], Hashable],
                 describe: Callable[[Any], str]) -> None:
        self.watch = Watch()
        self.timed_out = timed_out
        self.key = key
        self.describe = describe
        self.cancelled = threading.Event()

    def enter(self, item: Any) -> None:
        self.watch.start(item)
        if self.timed_out:
            seconds = self.timed_out.get(self.key(item))
            if seconds is not None:
                raise DecisionTimeoutError(
                    f"{self.describe(item)} ran over {seconds:.1f} s, past the budget "
                    "([processor] decision_budget_s): it was abandoned; make it faster, or "
                    "move slow work out of it")

    def check_not_cancelled(self) -> None:
        """Raise when the caller gave up on this call (it must write nothing then)."""
        if self.cancelled.is_set():
            raise DecisionTimeoutError("abandoned past the decision budget: nothing written")


def interrupt(thread: threading.Thread) -> None:
    """Raise DecisionTimeoutError in ``thread`` at its next Python instruction (a thread blocked
    in C, e.g. sleeping or reading a socket, gets it when the call returns)."""
    if thread.ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(DecisionTimeoutError))


class _Call:
    __slots__ = ("done", "error", "fn", "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


_STOP = object()


class BudgetedThread:
    """Runs calls one at a time in a thread of its own; :meth:`call` waits for one, and gives
    up on it when the item its :class:`Watch` names has run past the budget."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = self._start(self._jobs)

    def _start(self, jobs: queue.SimpleQueue[Any]) -> threading.Thread:
        thread = threading.Thread(target=self._serve, args=(jobs,), daemon=True, name=self.name)
        thread.start()
        return thread

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Any]) -> None:
        while True:
            job = jobs.get()
            if job is _STOP:
                return
            try:
                job.value = job.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller (or dropped)
                job.error = exc
            job.done.set()

    def call(self, fn: Callable[[], Any], watch: Watch, budget_s: float,
             on_abandon: Callable[[], None] | None = None) -> tuple[bool, Any]:
        """``(True, fn())``, or ``(False, item)`` when ``watch``'s item ran past ``budget_s``
        (``on_abandon`` is called, then the thread is abandoned and told to stop; later calls
        run in a new one). An error of ``fn`` is raised here."""
        job = _Call(fn)
        self._jobs.put(job)
        wait = min(WATCH_S, budget_s / 2) if budget_s > 0 else None
        while not job.done.wait(wait):
            item = watch.over(budget_s, time.monotonic())
            if item is not None and not job.done.is_set():
                if on_abandon is not None:
                    on_abandon()
                old, old_jobs = self._thread, self._jobs
                old_jobs.put(_STOP)  # it ends once the abandoned call returns
                self._jobs = queue.SimpleQueue()
                self._thread = self._start(self._jobs)
                interrupt(old)
                return False, item
        if job.error is not None:
            raise job.error
        return True, job.value

    def close(self) -> None:
        self._jobs.put(_STOP)
