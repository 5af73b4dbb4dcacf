"""How the processor's source shares a micro-batch out among tasks (pure planning, no Kafka)."""

from __future__ import annotations

import time
from collections.abc import Callable

from cqrs.config import load_config
from cqrs.processor.workers import ProcessorOptions
import pytest

from cqrs.processor.source import (
    COMMANDS_PER_TASK, TICK, TOPIC, CommandReader, SourceError, SourceSettings,
)


def _reader(serve_s: float, tasks: int = 2, quiet_tasks: int = 1,
            continuous: bool = False) -> CommandReader:
    opts = ProcessorOptions("cqrs.testing.example_app:app")
    return CommandReader(SourceSettings(load_config(env={}), opts, "t.commands", tasks=tasks,
                                        serve_s=serve_s, quiet_tasks=quiet_tasks,
                                        continuous=continuous))


def test_without_serving_only_partitions_with_planned_commands_get_a_task() -> None:
    plan = _reader(0.0).partitions({"0": 10, "1": 5, "2": 0, "3": 7}, {"0": 12, "1": 5, "2": 0, "3": 7})
    assert [p.ranges for p in plan] == [{0: (10, 12)}]
    assert plan[0].serve_until is None


def test_serving_tasks_take_every_partition_to_serve_what_arrives() -> None:
    plan = _reader(2.0).partitions({"0": 10, "1": 5, "2": 0, "3": 7}, {"0": 12, "1": 5, "2": 0, "3": 7})
    assert [p.ranges for p in plan] == [{0: (10, 12), 1: (5, 5), 2: (0, 0), 3: (7, 7)}]


def test_quiet_tasks_share_the_partitions_by_count() -> None:
    plan = _reader(2.0, quiet_tasks=2).partitions({str(p): 0 for p in range(4)},
                                                  {str(p): 0 for p in range(4)})
    assert sorted(len(p.ranges) for p in plan) == [2, 2]
    assert sorted(p for s in plan for p in s.ranges) == [0, 1, 2, 3]


def test_every_task_of_a_batch_serves_until_the_same_moment() -> None:
    before = time.time()
    plan = _reader(2.0, quiet_tasks=2).partitions({"0": 0, "1": 0}, {"0": 0, "1": 0})
    assert len(plan) == 2 and plan[0].serve_until == plan[1].serve_until
    assert before + 2.0 <= plan[0].serve_until <= time.time() + 2.0


def test_a_large_batch_is_shared_by_load_whole_partitions_per_task() -> None:
    n = COMMANDS_PER_TASK * 4
    plan = _reader(2.0).partitions({str(p): 0 for p in range(4)},
                                   {"0": n, "1": n // 2, "2": n // 2, "3": 0})
    assert len(plan) == 2
    assert sorted(sorted(p.ranges) for p in plan) == [[0, 3], [1, 2]]
    assert {p: r for s in plan for p, r in s.ranges.items()} == {
        0: (0, n), 1: (0, n // 2), 2: (0, n // 2), 3: (0, 0)}


def _kafka_says(reader: CommandReader, marks: Callable[[], dict[int, tuple[int, int]]]) -> None:
    """The reader's view of the topic: ``marks()`` its (low, high) watermarks, and the ends."""
    reader._marks = marks  # type: ignore[method-assign]
    reader._ends = lambda: {p: high for p, (_, high) in marks().items()}  # type: ignore[method-assign]


def test_a_continuous_source_moves_its_tick_so_batches_follow_each_other() -> None:
    reader = _reader(2.0, continuous=True)
    _kafka_says(reader, lambda: {0: (0, 5), 1: (0, 3)})
    first = reader.latestOffset({"0": 5, "1": 3}, None)
    second = reader.latestOffset(first, None)
    assert {k: v for k, v in first.items() if k != TICK} == {"0": 5, "1": 3, TOPIC: "t.commands"}
    assert first[TICK] != second[TICK]
    # the tick is not a partition: planning ignores it
    plan = reader.partitions(first, second)
    assert sorted(p for s in plan for p in s.ranges) == [0, 1]


def test_a_source_that_is_not_continuous_has_no_tick() -> None:
    for reader in (_reader(2.0), _reader(0.0, continuous=True)):
        _kafka_says(reader, lambda: {0: (0, 5)})
        assert reader.latestOffset({"0": 5}, None) == {"0": 5, TOPIC: "t.commands"}


def test_available_now_stops_at_what_the_topic_held_when_it_started() -> None:
    reader = _reader(0.0)
    marks = {0: (0, 5), 1: (0, 3)}
    _kafka_says(reader, lambda: marks)
    reader.prepareForTriggerAvailableNow()
    marks = {0: (0, 9), 1: (0, 4)}  # more arrives after the run started: not for this run
    # an earlier serving run's unfinished batch ends with a tick: a batch without it follows
    assert reader.latestOffset({"0": 2, "1": 3, TICK: 8}, None) == {"0": 5, "1": 3,
                                                                    TOPIC: "t.commands"}
    done = {"0": 5, "1": 3, TOPIC: "t.commands"}
    assert reader.latestOffset(done, None) == done  # the same offset: no further batch


def test_a_batch_of_several_tasks_has_one_plan_that_a_re_run_repeats() -> None:
    reader = _reader(2.0, quiet_tasks=2)
    start, end = {"0": 0, "1": 0, TICK: 4}, {"0": 3, "1": 5, TICK: 5}
    plan = reader.partitions(start, end)
    assert len({s.plan for s in plan}) == 1 and plan[0].plan is not None
    assert [s.index for s in plan] == [0, 1]
    assert all(s.shares == [p.ranges for p in plan] for s in plan)
    assert reader.partitions(start, end)[0].plan == plan[0].plan  # Spark re-runs the batch
    # the next batch, nothing new but its tick: another plan
    assert reader.partitions(end, {**end, TICK: 6})[0].plan != plan[0].plan


def test_shares_stay_the_same_from_batch_to_batch_unless_uneven() -> None:
    reader = _reader(2.0, quiet_tasks=2)
    quiet = reader.partitions({str(p): 0 for p in range(4)}, {str(p): 0 for p in range(4)})
    busy = reader.partitions({str(p): 0 for p in range(4)}, {"0": 9000, "1": 8000, "2": 9500, "3": 8500})
    assert [sorted(s.ranges) for s in quiet] == [sorted(s.ranges) for s in busy] == [[0, 2], [1, 3]]


def test_a_checkpoint_of_another_topic_is_refused_not_read_as_this_ones() -> None:
    """Offsets are per partition number: those of another topic (the same app under another
    topic prefix, on a checkpoint it shared) would skip this topic's commands silently."""
    reader = _reader(2.0, continuous=True)
    _kafka_says(reader, lambda: {0: (0, 5)})
    assert reader.initialOffset() == {"0": 0, TOPIC: "t.commands"}
    with pytest.raises(SourceError, match=r"'other.commands'.*'t.commands'.*checkpoint of its own"):
        reader.latestOffset({"0": 3, TOPIC: "other.commands"}, None)
    assert reader.latestOffset({"0": 3}, None)[TOPIC] == "t.commands"  # recorded before: none


def test_the_default_checkpoint_has_the_topic_prefix_in_it() -> None:
    from cqrs.processor.job import checkpoint_for

    cfg = load_config(env={"CQRS_SPARK_CHECKPOINT_DIR": "/ck"})
    assert checkpoint_for(cfg, "bank") == "/ck/bank/processor"
    prefixed = cfg.with_overrides(kafka={"topic_prefix": "staging."})
    assert checkpoint_for(prefixed, "bank") == "/ck/staging.bank/processor"
