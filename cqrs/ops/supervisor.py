"""Keep several streaming queries of one SparkSession running: a query that fails (or cannot
start) is restarted on its own after a back-off, the others keep running; a query whose
generation changes (a projection rebuilt) is stopped and started on the new one. A query
refused for a reason no restart can change (:func:`refusal`: the app's classes cannot read the
stored schemas) is not restarted: its state is ``refused`` until another release is started."""

from __future__ import annotations

import math
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cqrs.errors import IncompatibleSchemaError
from cqrs.ops.board import StatusBoard

__all__ = ["MAX_BACKOFF_S", "QuerySpec", "Supervisor", "refusal"]

MAX_BACKOFF_S = 300.0
HEALTHY_AFTER_S = 60.0  # a query running this long after a restart resets its back-off


def _no_generation() -> int | None:
    return None


def refusal(error: BaseException | None) -> str | None:
    """Why a query that failed with ``error`` must not be restarted, or None (restart it after
    its back-off). A restart cannot help when the app's classes cannot read the stored schemas
    (the check every job runs before it starts): it would fail the same way until another
    release is deployed, so it is refused, and says so, instead of retried for ever."""
    if isinstance(error, IncompatibleSchemaError):
        return "incompatible schema"
    return None


@attrs.frozen
class QuerySpec:
    """One query to keep running: ``start(generation)`` starts it (on its own checkpoint) and
    returns the ``StreamingQuery``; ``generation()`` says which generation should run now."""

    name: str  # stable across restarts, e.g. "processor", "projector:balances"
    kind: str  # processor | projector | retrier | process-manager | scheduler | history
    input_topic: str
    start: Callable[[int | None], Any]
    generation: Callable[[], int | None] = _no_generation
    # asks the running query to plan no more micro-batches, so it stops between two of them
    # (see cqrs.spark_session.stop_between_batches); None: it is stopped once no batch runs
    drain: Callable[[], object] | None = None


@attrs.define
class _Slot:
    spec: QuerySpec
    query: Any = None
    generation: int | None = None
    failures: int = 0
    retry_at: float = 0.0
    started_at: float = 0.0
    ready: bool = False  # the board was told this run is past initialising
    refused: str | None = None  # why it is not restarted (see refusal)


class Supervisor:
    """Starts the specs' queries and watches them until :meth:`stop` (or ``stop_event``)."""

    def __init__(self, board: StatusBoard, specs: Sequence[QuerySpec], *, backoff_s: float = 5.0,
                 report: Callable[[str], None] = print, poll_s: float = 1.0,
                 start_timeout_s: float = 180.0) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"query names must be unique, got {names}")
        self.board = board
        self.backoff_s = backoff_s
        self.report = report
        self.poll_s = poll_s
        self.start_timeout_s = start_timeout_s
        self._slots = [_Slot(s) for s in specs]
        self._stop = threading.Event()
        for s in specs:
            board.declare(s.name, s.kind, s.input_topic)

    def _say(self, message: str) -> None:
        self.board.log(message)
        self.report(message)

    def _start(self, slot: _Slot) -> None:
        spec = slot.spec
        try:
            generation = spec.generation()
            query = spec.start(generation)
        except Exception as exc:  # noqa: BLE001 - any start failure is retried the same way
            self._failed(slot, f"could not start: {type(exc).__name__}: {exc}", exc)
            return
        slot.query, slot.generation, slot.started_at = query, generation, time.monotonic()
        slot.ready = False
        self.board.bind(spec.name, str(query.id), str(query.runId), str(query.name), generation)
        gen = f" on generation {generation}" if generation is not None else ""
        self._say(f"{spec.name}: query {query.name} running{gen}")

    def _failed(self, slot: _Slot, error: str, exc: BaseException | None = None) -> None:
        why = refusal(exc)
        if why is not None:
            slot.query, slot.refused, slot.retry_at = None, why, math.inf
            self.board.set_state(slot.spec.name, "refused", f"{why}: {exc}")
            self._say(f"{slot.spec.name}: refused, {why}; not restarted: start a release whose "
                      f"classes read the stored messages (add a default or an upcaster). {exc}")
            return
        wait = min(MAX_BACKOFF_S, self.backoff_s * 2 ** slot.failures)
        slot.failures += 1
        slot.query = None
        slot.retry_at = time.monotonic() + wait
        self.board.set_state(slot.spec.name, "restarting", error)
        self._say(f"{slot.spec.name}: {error.splitlines()[0] if error else 'stopped'}; "
                  f"restart {slot.failures} in {wait:.0f} s")

    def _note_ready(self, slot: _Slot) -> None:
        """Tell the board once when the slot's query is past initialising its sources."""
        from cqrs.spark_session import past_initialising

        if slot.query is not None and past_initialising(slot.query):
            slot.ready = True
            self.board.mark_ready(slot.spec.name)

    def check(self) -> None:
        """One round: restart what failed and is due, follow generation switches."""
        now = time.monotonic()
        for slot in self._slots:
            spec = slot.spec
            if slot.query is None:
                if slot.refused is None and now >= slot.retry_at:
                    self._start(slot)
                continue
            if not slot.query.isActive:
                error = slot.query.exception()
                self._failed(slot, str(error) if error is not None else "stopped without an error",
                             error)
                continue
            if not slot.ready:
                self._note_ready(slot)
            if slot.failures and now - slot.started_at > HEALTHY_AFTER_S:
                slot.failures = 0
            try:
                wanted = spec.generation()
            except Exception:  # noqa: BLE001 - keep the running one; try again next round
                self.board.log(f"{spec.name}: generation lookup failed: "
                               f"{traceback.format_exc(limit=1)}")
                continue
            if wanted != slot.generation:
                self._say(f"{spec.name}: generation {wanted} is current now; switching to it")
                slot.query.stop()
                slot.query = None
                self._start(slot)

    def run(self, stop_event: threading.Event | None = None) -> None:
        """Start every query, one after the other (each past initialising its sources before
        the next starts: see :func:`~cqrs.spark_session.wait_until_started`), then watch them
        until stopped."""
        from cqrs.spark_session import wait_until_started

        for slot in self._slots:
            self._start(slot)
            if slot.query is not None and wait_until_started(slot.query, self.start_timeout_s):
                self._note_ready(slot)
        try:
            while not self._stop.is_set() and not (stop_event is not None and stop_event.is_set()):
                self._stop.wait(self.poll_s)
                self.check()
        finally:
            self.stop_queries()

    def stop(self) -> None:
        self._stop.set()

    def stop_queries(self) -> None:
        """Stop every running query between its micro-batches (all drained at once)."""
        from cqrs.spark_session import stop_between_batches

        running = [(slot.query, slot.spec.drain) for slot in self._slots
                   if slot.query is not None and slot.query.isActive]
        if running:
            self._say("stopping after the running micro-batches")
            stop_between_batches(running)
        for slot in self._slots:
            if slot.refused is None:  # a refused one says why until the end
                self.board.set_state(slot.spec.name, "stopped")
