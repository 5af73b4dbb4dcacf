"""Lanes: an aggregate whose decision runs long is set aside, so that one slow or hung handler
holds up its own aggregate only.

A serving task decides a slice's aggregates one after the other in a *decider* thread while
its own thread watches (:func:`decide_items`). When one aggregate's decision has run for
``[processor] slow_decision_s``, the watcher sets that aggregate aside: the decider thread goes
on with it alone, as its *lane*, and a fresh decider takes the slice's remaining aggregates.
The aggregate's later commands queue in its lane, in offset order, and are decided there one
at a time; once the lane is empty the aggregate's state goes back to the task's cache and the
aggregate is decided with the others again.

A command whose decision runs past ``[processor] decision_budget_s`` is answered ``failed``
(:class:`~cqrs.errors.DecisionTimeoutError`) and dead-lettered by
:meth:`~cqrs.processor.step.AggregateStep.timed_out`; its lane goes on with the next command in
a new thread, from the state before it (commands decided with it in the same call are decided
again). The abandoned thread is asked to stop (an exception raised in it at its next Python
instruction) and whatever it returns is dropped.

What a lane decided is written by the task that serves its partition, ahead of the slice's own
records and state rows (records first, rows once Kafka acknowledged them): an aggregate whose
lane emptied is decided by the same slice, on the state the lane left. A task that ends
while a lane still holds commands records its partition's position at the lane's first
command, so that whoever serves the partition next reads them again (commands of other
aggregates read again are skipped by their rows' ``applied_offset``); a worker that finds its
partition served by another since drops that partition's lanes with what they decided.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cqrs.budget import WATCH_S, Watch, interrupt
from cqrs.processor.state_table import StoredAggregate
from cqrs.processor.step import UNDECODED, AggregateStep, InputRecord, StepResult
from cqrs.results import AggregateRecord

__all__ = ["Decider", "Item", "Lane", "Lanes", "apply_item", "decide_items", "unpacked_state"]



@attrs.define(eq=False)
class Item:
    """One aggregate's commands of a slice, to decide. ``prepare`` (run by the decider) fills
    in its state and drops commands its row says were applied; then the step's result."""

    slice_index: int
    key: tuple[Any, Any]
    records: list[InputRecord]
    row: StoredAggregate | None = None
    record: AggregateRecord | None = None
    decoded: Any = None
    result: StepResult | None = None
    error: BaseException | None = None
    lane: Lane | None = None  # set aside while it was decided
    cached: Any = None  # the worker's cached state it started from (partition._Cached), if any
    # its state row as the worker keeps it packed (StoredAggregate.packed), when it is to be
    # decided on that (see apply_item); ``row`` and ``record`` are None until unpacked
    packed: bytes | None = None
    keep_decoded: bool = True  # its new state is kept decoded in the worker's cache (else packed)


def apply_item(step: AggregateStep, item: Item, watch: Watch | None) -> StepResult:
    """The step of a prepared item: on its packed row when it has one
    (:meth:`AggregateStep.apply_packed`, the new state packed again), else (or when that does
    not take it) on its state, the row unpacked into ``item.row`` and ``item.record``."""
    agg_type, agg_id = item.key
    if item.packed is not None:
        result = step.apply_packed(agg_type, agg_id, item.packed, item.records, watch)
        if result is not None:
            return result
        item.row, item.record, item.decoded = unpacked_state(step, item)
    return step.apply(agg_type, agg_id, item.record, item.records, item.decoded, watch)


def unpacked_state(step: AggregateStep, item: Item) -> tuple[StoredAggregate, AggregateRecord, Any]:
    """The row, record and aggregate (undecoded) of an item's packed state."""
    assert item.packed is not None
    row = StoredAggregate.unpacked(item.key[1], item.key[0], item.packed)
    return row, step.load_state(row.record), UNDECODED


@attrs.define(eq=False)
class _TimedOut:
    """A command whose decision ran past the budget: answered as such when its lane gets to it."""

    record: InputRecord
    seconds: float


class Lane:
    """One aggregate set aside: its queued commands, the thread deciding them, and what it
    decided that the serving task has not written yet."""

    def __init__(self, key: tuple[str, str], partition: int, row: StoredAggregate | None,
                 record: AggregateRecord | None, decoded: Any, watch: Watch,
                 thread: threading.Thread, inflight: list[InputRecord]) -> None:
        self.key = key
        self.partition = partition
        self.row = row  # the aggregate's state row as of its last decision written
        self.commands = 0 if row is None else row.commands  # the row's count, for new rows
        self.record = record  # the state before the decision running now (or the next one)
        self.decoded = decoded
        self.queue: collections.deque[InputRecord | _TimedOut] = collections.deque()
        self.inflight = inflight  # the records of the decision running now
        self.done: list[tuple[StepResult, list[InputRecord]]] = []
        self.taken = max((r.offset for r in inflight), default=-1)  # the highest given to it
        self.epoch = 0  # a thread whose epoch is not the lane's is abandoned
        self.thread: threading.Thread | None = thread
        self.watch = watch
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def offsets(self) -> list[int]:
        """Offsets of the commands this lane holds and has not handed over yet."""
        held = [r.offset for r in self.inflight]
        held += [(c.record if isinstance(c, _TimedOut) else c).offset for c in self.queue]
        held += [r.offset for _, records in self.done for r in records]
        return held

    def post(self, result: StepResult, records: list[InputRecord]) -> None:
        """Keep a decision (called with the lock held)."""
        self.done.append((result, records))
        if result.record is not None:
            self.record, self.decoded = result.record, result.state

    def run(self, step: AggregateStep, epoch: int) -> None:
        """Decide the queued commands one at a time until none is left (a lane's thread)."""
        agg_type, agg_id = self.key
        try:
            while True:
                with self.lock:
                    if self.epoch != epoch:
                        return
                    if not self.queue:
                        self.thread = None  # idle: the serving task collects the lane
                        return
                    item = self.queue.popleft()
                    record, decoded = self.record, self.decoded
                    rec = item.record if isinstance(item, _TimedOut) else item
                    self.inflight = [rec]
                if isinstance(item, _TimedOut):
                    result = step.timed_out(agg_type, agg_id, record, item.record, item.seconds)
                else:
                    result = step.apply(agg_type, agg_id, record, [item], decoded, self.watch)
                with self.lock:
                    if self.epoch != epoch:
                        return
                    self.post(result, self.inflight)
                    self.inflight = []
        except BaseException as exc:  # noqa: BLE001 - an abandoned thread's stop, or a bug
            with self.lock:
                if self.epoch == epoch:
                    self.error = exc
                    self.thread = None

    def start(self, step: AggregateStep) -> None:
        """Run the queue in a new thread (called with the lock held)."""
        self.thread = threading.Thread(target=self.run, args=(step, self.epoch), daemon=True,
                                       name=f"cqrs-lane-{self.key[1][:40]}")
        self.thread.start()

    def check_budget(self, step: AggregateStep, budget_s: float, now: float) -> bool:
        """Past the budget, the running decision is abandoned: its command is answered as timed
        out, the commands decided with it are queued again, a new thread takes the queue.
        True when that happened (called with the lock held)."""
        since = self.watch.since
        rec = self.watch.over(budget_s, now) if self.inflight else None
        if rec is None:
            return False
        i = next((n for n, r in enumerate(self.inflight) if r is rec), None)
        if i is None:  # the watch has moved on: the decision is finishing
            return False
        old = self.thread
        self.epoch += 1
        self.queue.extendleft(reversed([*self.inflight[:i], _TimedOut(rec, now - since),
                                        *self.inflight[i + 1:]]))
        self.inflight = []
        self.watch = Watch()
        self.start(step)
        if old is not None:
            interrupt(old)
        return True


class Lanes:
    """A worker's lanes, by aggregate."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], Lane] = {}

    def __bool__(self) -> bool:
        return bool(self.by_key)

    def of_partitions(self, partitions: set[int]) -> list[Lane]:
        return [lane for lane in self.by_key.values() if lane.partition in partitions]

    def drop_partition(self, partition: int) -> None:
        """Forget the partition's lanes and what they decided (another worker served it)."""
        for lane in self.of_partitions({partition}):
            with lane.lock:
                lane.epoch += 1
                thread, lane.thread = lane.thread, None
            if thread is not None:
                interrupt(thread)
            del self.by_key[lane.key]

    def first_held(self, partition: int) -> int | None:
        """The lowest offset the partition's lanes hold, not written yet (None: nothing)."""
        held = [o for lane in self.of_partitions({partition}) for o in lane.offsets()]
        return min(held) if held else None


class Decider:
    """A thread that decides the items it is handed, while the serving task's thread watches
    (see :func:`decide_items`); it becomes a lane's thread when its aggregate is set aside."""

    def __init__(self, step: AggregateStep) -> None:
        self.step = step
        self.jobs: collections.deque[tuple[_Run, int]] = collections.deque()
        self.ready = threading.Condition()
        self.retired = False  # replaced: it ends once its item is done
        self.thread = threading.Thread(target=self._serve, daemon=True, name="cqrs-decider")
        self.thread.start()

    def submit(self, run: _Run, token: int) -> None:
        with self.ready:
            self.jobs.append((run, token))
            self.ready.notify()

    def _serve(self) -> None:
        while True:
            with self.ready:
                while not self.jobs:
                    self.ready.wait()
                run, token = self.jobs.popleft()
            lane = run.decide(self.step, token)
            if lane is not None:  # this thread is the lane of the aggregate it was deciding
                lane[0].run(self.step, lane[1])
                return
            if self.retired:
                return


class _Run:
    """A slice's items, taken in order by whichever decider holds the current token."""

    def __init__(self, items: Sequence[Item], prepare: Callable[[Item], bool],
                 finish: Callable[[Item], None]) -> None:
        self.items = items
        self.prepare = prepare
        self.finish = finish
        self.next = 0
        self.left = len(items)
        self.token = 0
        self.current: Item | None = None
        self.watch = Watch()
        self.started = 0.0
        self.lock = threading.Lock()
        self.done = threading.Event()
        if not items:
            self.done.set()

    def decide(self, step: AggregateStep, token: int) -> tuple[Lane, int] | None:
        """Decide items until none is left or another decider took over; the lane this thread
        now serves, if its item was set aside meanwhile."""
        watch = self.watch
        while True:
            with self.lock:
                if self.token != token or self.next >= len(self.items):
                    return None
                item = self.items[self.next]
                self.next += 1
            try:
                if self.prepare(item):
                    # watched once prepared, not before: an item set aside while its state was
                    # being prepared would hand its lane no state row (and so no command count,
                    # the row's write timestamp), and the cache's state would be dropped
                    with self.lock:
                        self.current, self.started = item, time.monotonic()
                    item.result = apply_item(step, item, watch)
            except BaseException as exc:  # noqa: BLE001 - handed to the serving task
                item.error = exc
            with self.lock:
                if self.current is item:  # (another decider's item may be current by now)
                    self.current = None
                lane = item.lane
            if lane is None:  # no longer current, so never set aside: the slice's to finish
                if item.error is None:
                    try:
                        self.finish(item)
                    except BaseException as exc:  # noqa: BLE001 - handed to the serving task
                        item.error = exc
                with self.lock:
                    self._finished_one()
                continue
            with lane.lock:  # set aside meanwhile: this thread is its lane now
                if lane.epoch != 0:
                    return None  # past the budget already: abandoned
                if item.error is not None:
                    lane.error, lane.thread = item.error, None
                    return None
                if item.result is not None:
                    lane.post(step.recorded(item.result), lane.inflight)
                lane.inflight = []
            return lane, 0

    def _finished_one(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()


def decide_items(decider: Callable[[], Decider], replace: Callable[[], Decider], items: Sequence[Item],
                 prepare: Callable[[Item], bool],
                 set_aside: Callable[[Item, Watch, threading.Thread], Lane], slow_s: float,
                 finish: Callable[[Item], None]) -> int:
    """Decide ``items`` (in order) in the worker's decider thread, setting aside each one whose
    decision runs past ``slow_s`` (``set_aside`` makes its lane, served by the decider's
    thread from then on; ``replace`` retires that decider and makes a new one for the rest).
    ``finish(item)`` runs in the decider right after each item it decided and kept (not set
    aside, no error), in order: what the slice does with a decision, while its objects are
    still in the CPU's caches. Returns how many were set aside; an error of the step (or of
    ``finish``) is raised here."""
    run = _Run(items, prepare, finish)
    if not items:
        return 0
    decider().submit(run, run.token)
    laned = 0
    wait = min(WATCH_S, slow_s / 2) if slow_s > 0 else None
    while not run.done.wait(wait):
        with run.lock:
            item = run.current
            if item is None or slow_s <= 0 or time.monotonic() - run.started <= slow_s:
                continue
            item.lane = set_aside(item, run.watch, decider().thread)
            laned += 1
            run.current = None
            run.token += 1
            run.watch = Watch()
            run._finished_one()
            token = run.token
        fresh = replace()  # that decider's thread is the lane's now, whatever is left to do
        if not run.done.is_set():
            fresh.submit(run, token)
    for item in items:
        if item.error is not None and item.lane is None:
            raise item.error
    return laned
