"""How the processor's source shares a micro-batch out among tasks (pure planning, no Kafka)."""

from __future__ import annotations

from cqrs.config import load_config
from cqrs.processor.job import ProcessorOptions
from cqrs.processor.source import COMMANDS_PER_TASK, CommandReader, SourceSettings


def _reader(serve_s: float, tasks: int = 2) -> CommandReader:
    opts = ProcessorOptions("cqrs.testing.example_app:app")
    return CommandReader(SourceSettings(load_config(env={}), opts, "t.commands", tasks=tasks,
                                        serve_s=serve_s))


def test_without_serving_only_partitions_with_planned_commands_get_a_task() -> None:
    plan = _reader(0.0).partitions({"0": 10, "1": 5, "2": 0, "3": 7}, {"0": 12, "1": 5, "2": 0, "3": 7})
    assert [p.ranges for p in plan] == [{0: (10, 12)}]


def test_serving_tasks_take_every_partition_to_serve_what_arrives() -> None:
    plan = _reader(2.0).partitions({"0": 10, "1": 5, "2": 0, "3": 7}, {"0": 12, "1": 5, "2": 0, "3": 7})
    assert [p.ranges for p in plan] == [{0: (10, 12), 1: (5, 5), 2: (0, 0), 3: (7, 7)}]


def test_a_large_batch_is_shared_by_load_whole_partitions_per_task() -> None:
    n = COMMANDS_PER_TASK * 4
    plan = _reader(2.0).partitions({str(p): 0 for p in range(4)},
                                   {"0": n, "1": n // 2, "2": n // 2, "3": 0})
    assert len(plan) == 2
    assert sorted(sorted(p.ranges) for p in plan) == [[0, 3], [1, 2]]
    assert {p: r for s in plan for p, r in s.ranges.items()} == {
        0: (0, n), 1: (0, n // 2), 2: (0, n // 2), 3: (0, 0)}
