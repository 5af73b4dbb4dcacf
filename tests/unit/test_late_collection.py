"""The collection a processor task owes (cqrs.processor.partition._LateCollection): a task that
leaves many young objects freezes them uncollected, and their garbage is reclaimed by a full
collection every RECLAIM_AFTER_DEFERRED such tasks. Pure code, no services."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from cqrs.processor.partition import RECLAIM_AFTER_DEFERRED, _LateCollection


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    yield
    gc.unfreeze()
    gc.collect()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_a_deferred_tasks_garbage_is_frozen_then_reclaimed_by_the_full_collection(collector: None) -> None:
    late = _LateCollection()
    gone = _cycle()  # a task's garbage: a reference cycle
    late.defer()
    gc.collect()  # PySpark's daemon, between two tasks: nothing young left to walk
    assert gone() is not None, "frozen with the task's objects, not collected"
    late.start()
    late.wait()
    assert gone() is not None and late.deferred == 1
    late.deferred = RECLAIM_AFTER_DEFERRED
    late.start()  # the reclaim: everything unfrozen and walked once
    late.wait()
    assert gone() is None and late.deferred == 0
    assert gc.isenabled()


def test_a_task_that_is_not_deferred_has_its_young_garbage_collected(collector: None) -> None:
    late = _LateCollection()
    gone = _cycle()
    late.start()
    late.wait()
    assert gone() is None and late.deferred == 0
