"""The processor's Spark source: a Python streaming data source over the commands topic whose
tasks process what they read.

Spark plans each micro-batch as usual: the driver side of this source asks Kafka for the end
offsets (capped by ``maxOffsetsPerTrigger``), Spark writes them to the checkpoint's offset log,
hands one task per Kafka partition to the Python workers and commits the batch when every
task succeeded. A task takes whole partitions (at most one task per core Spark has, so a batch's per-task
costs are paid once per core, not once per partition) and runs
:func:`~cqrs.processor.partition.run_task` on their offset ranges, which reads them with
librdkafka, processes them and, with ``serve_s``, goes on with what arrives on them for that
long; it returns one row of figures. Serving, every partition goes to a task, also those with
nothing planned.

Why not Spark's Kafka connector here: the records would pass through the JVM (Kafka consumer,
rows, header expressions, Arrow) before reaching the Python step that needs them; measured on
the 2-core box, that path cost more CPU per command than the step itself. Reading in the worker
keeps the JVM to planning and bookkeeping. Recovery is Spark's: a failed batch is re-run from
the same offsets, and the state table's fence makes the re-run harmless. The projectors, which
hand records to Python too but in bulk columns, keep the connector.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pickle
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow,
)

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.processor.partition import STATS_FIELDS, Worker
from cqrs.processor.workers import ProcessorOptions, worker_for

if TYPE_CHECKING:
    from cqrs.kafka_io import OffsetReader
    from cqrs.processor.state_table import Position

__all__ = [
    "SOURCE_NAME", "STATS_SCHEMA", "TICK", "CommandReader", "CommandSource", "Slices",
    "SourceError", "SourceSettings", "claim_share", "command_source_options", "new_stop_file",
    "register_source",
]

SOURCE_NAME = "cqrs-commands"
STATS_SCHEMA = ", ".join(
    f"{f} {'double' if f.endswith('_s') else 'string' if f == 'longest_decision' else 'long'}"
    for f in STATS_FIELDS)
_PAYLOAD = "payload"
COMMANDS_PER_TASK = 2000  # a micro-batch gets another task per this many commands, up to a core each
UNEVEN = 1.25  # shares in turn unless one would get this much more than an even split
TICK = "tick"  # a serving source's offset key that moves every micro-batch (not a partition)
TOPIC = "topic"  # the offset's topic: a checkpoint recorded for another topic is refused


@attrs.frozen
class SourceSettings:
    """What the source needs, carried to the driver and the workers through one option."""

    cfg: CqrsConfig
    opts: ProcessorOptions
    topic: str
    starting_offsets: str = "earliest"  # or Spark's JSON form {topic: {partition: offset}}
    tasks: int = 2  # tasks per micro-batch at most (the cores Spark has): partitions share them
    serve_s: float = 0.0  # how long a task goes on with new commands after its planned ones
    quiet_tasks: int = 1  # tasks that serve when few commands wait (at most ``tasks``)
    continuous: bool = False  # serving, batches follow each other also when nothing new came
    # a path on the driver's host: once a file is there, no further micro-batch is planned (a
    # stop between batches: the running one ends, then the query is idle and stops cleanly)
    stop_file: str | None = None


def new_stop_file() -> str:
    """A fresh path for :attr:`SourceSettings.stop_file` (nothing is created): touch it to have
    the source plan no more micro-batches; the source removes it when its query stops."""
    return os.path.join(tempfile.gettempdir(), f"cqrs-stop-{uuid.uuid4().hex}")


def command_source_options(settings: SourceSettings) -> dict[str, str]:
    # compressed: Spark runs its redaction regex over option values, which overflows the
    # stream thread's stack on a long one
    return {_PAYLOAD: base64.b64encode(zlib.compress(pickle.dumps(settings), 9)).decode("ascii")}


def _settings(options: Any) -> SourceSettings:
    return pickle.loads(zlib.decompress(base64.b64decode(options[_PAYLOAD])))  # noqa: S301 - ours


WORKER_POOL_VARIABLE = "CQRS_PYTHON_WORKERS"


def register_source(spark: Any) -> None:
    """Register the source with the session (idempotent).

    Its tasks get Python workers of their own: the source's function carries an environment
    variable (:data:`WORKER_POOL_VARIABLE`), and Spark keeps a pool of workers per environment.
    A lane a serving task left deciding in its worker (:mod:`cqrs.processor.lanes`) is then
    found by the next task of its partitions; in a driver shared with projectors (``cqrs run
    app``), whose tasks took the idle worker in turn, the next task landed on the other worker
    about every other batch, dropped the lane and decided its command again, so a slow
    aggregate's commands hardly moved."""
    env = spark.sparkContext.environment  # copied into each function wrapped while it is set
    before = env.get(WORKER_POOL_VARIABLE)
    env[WORKER_POOL_VARIABLE] = "processor"
    try:
        spark.dataSource.register(CommandSource)
    finally:
        if before is None:
            env.pop(WORKER_POOL_VARIABLE, None)
        else:
            env[WORKER_POOL_VARIABLE] = before


class SourceError(CqrsError, RuntimeError):
    """A task of the processor's source could not take its share of a micro-batch."""


# Module-level classes: Spark pickles the reader into every task, and a class defined inside a
# function would travel by value (its code with it) and be rebuilt in the worker each time.


class Slices(InputPartition):  # type: ignore[misc]
    """One task of a micro-batch: its share {partition: (start, end)}, and until when it serves
    what arrives after them (the driver's ``time.time()``; None: it does not).

    A batch of several tasks gives each every share (``shares``) and a ``plan`` id: a task
    takes the share whose partitions its Python worker processed last, if no other task of
    the batch took it first (see :func:`claim_share`), else the next free one, its own
    (``index``) first."""

    def __init__(self, ranges: dict[int, tuple[int, int]], serve_until: float | None = None,
                 plan: str | None = None, index: int = 0,
                 shares: list[dict[int, tuple[int, int]]] | None = None) -> None:
        self.ranges = ranges
        self.serve_until = serve_until
        self.plan = plan
        self.index = index
        self.shares = shares


class CommandReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Plans micro-batches over the commands topic; its tasks process what they read."""

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self._offsets: Any = None  # the driver side's consumer, kept between micro-batches
        self._tick = 0  # see latestOffset
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow: where to stop
        # in each plan id: a batch run again after a restart gets claims of its own, so a first
        # attempt of a task finds no claim of its own index to resume (see claim_share)
        self._run = uuid.uuid4().hex[:12]

    def __getstate__(self) -> dict[str, Any]:  # tasks get the settings, not the consumer
        return {"settings": self.settings, "_offsets": None}

    def _reader(self) -> OffsetReader:
        from cqrs.kafka_io import OffsetReader

        if self._offsets is None:
            self._offsets = OffsetReader(self.settings.cfg, self.settings.topic)
        return self._offsets

    def _marks(self) -> dict[int, tuple[int, int]]:
        return self._reader().watermarks()

    def _ends(self) -> dict[int, int]:
        return self._reader().ends()

    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        marks = self._marks()
        start: dict[str, Any] = {str(p): low for p, (low, _) in marks.items()}
        if self.settings.starting_offsets != "earliest":
            given = json.loads(self.settings.starting_offsets).get(self.settings.topic, {})
            for p, offset in given.items():
                if int(offset) >= 0:  # -2: earliest
                    start[str(p)] = max(int(offset), marks[int(p)][0])
        start[TOPIC] = self.settings.topic
        return start

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """``--available-now``: process what the topic holds now, in as many batches as that
        takes (an unfinished batch of an earlier run first), and nothing that comes later."""
        self._target = {str(p): high for p, (_, high) in self._marks().items()}

    def getDefaultReadLimit(self) -> Any:  # noqa: N802
        cap = self.settings.opts.max_offsets_per_trigger
        return ReadMaxRows(cap) if cap else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: Any) -> dict:  # noqa: N802
        if self.settings.stop_file is not None and os.path.exists(self.settings.stop_file):
            return start  # stopping: nothing new, so no further micro-batch
        recorded = start.get(TOPIC, self.settings.topic)  # older checkpoints: not recorded
        if recorded != self.settings.topic:
            raise SourceError(
                f"this processor's checkpoint holds offsets of topic {recorded!r}, but it reads "
                f"{self.settings.topic!r} (another topic prefix?): offsets of one topic would skip "
                "commands of the other. Give each topic prefix a checkpoint of its own (the "
                "default, <checkpoint_dir>/<topic prefix><app>/processor, does), or pass --checkpoint")
        ends: dict[str, Any] = {str(p): high for p, high in self._ends().items()}
        if self._target is not None:
            ends = {p: min(o, self._target.get(p, o)) for p, o in ends.items()}
        start = _partitions_of(start)
        for p in start:
            ends.setdefault(p, start[p])
        if isinstance(limit, ReadMaxRows):
            ends = _capped(start, ends, limit.max_rows)
        if self.settings.continuous and self.settings.serve_s > 0:
            # serving tasks run back to back, also when nothing new came: Spark plans a batch
            # only for a moved offset, and a batch planned once commands arrive starts them a
            # few hundred milliseconds late on a busy machine (a burst's first ~0.5 s on 2 cores)
            self._tick += 1
            ends[TICK] = self._tick
        ends[TOPIC] = self.settings.topic
        return ends

    def partitions(self, start: dict, end: dict) -> Sequence[Slices]:
        serving = self.settings.serve_s > 0
        batch = json.dumps([start, end], sort_keys=True)
        start, end = _partitions_of(start), _partitions_of(end)
        # a serving task takes partitions with nothing planned too: it serves what they get
        waiting = [(int(p), int(start.get(p, 0)), int(e)) for p, e in sorted(end.items())
                   if serving or int(e) > int(start.get(p, 0))]
        # a small batch goes to the quiet tasks (one unless configured): more would each add
        # their fixed costs (a Kafka assignment, Cassandra and Kafka round trips) for little
        # work to share, and hold a core that other queries of the driver may want
        total = sum(e - s for _, s, e in waiting)
        cap = min(self.settings.tasks, len(waiting))
        tasks = max(1, min(cap, self.settings.quiet_tasks), min(cap, total // COMMANDS_PER_TASK))
        # each task takes whole partitions (an aggregate's commands stay in one task): in turn,
        # the same shares from batch to batch (a share then tends to stay with the Python
        # worker that holds its states), unless that is uneven; then the busiest first to the
        # least loaded task
        shares: list[dict[int, tuple[int, int]]] = [{} for _ in range(tasks)]
        loads = [0] * tasks
        for i, (p, s, e) in enumerate(waiting):
            shares[i % tasks][p] = (s, e)
            loads[i % tasks] += e - s
        if max(loads) > max(COMMANDS_PER_TASK, UNEVEN * total / tasks):
            shares, loads = [{} for _ in range(tasks)], [0] * tasks
            for p, s, e in sorted(waiting, key=lambda w: w[1] - w[2]):
                i = loads.index(min(loads))
                shares[i][p] = (s, e)
                loads[i] += e - s
        shares = [share for share in shares if share]
        # one deadline for every task of the batch, however late each starts: the batch ends
        # when its last task does, and one that stopped earlier would leave its core idle
        until = time.time() + self.settings.serve_s if serving else None
        if len(shares) == 1:
            return [Slices(shares[0], until)]
        plan = hashlib.sha1(f"{self._run} {batch} {[sorted(sh) for sh in shares]}".encode()
                            ).hexdigest()[:20]
        return [Slices(share, until, plan, i, shares) for i, share in enumerate(shares)]

    def read(self, partition: Slices) -> Iterator[tuple[Any, ...]]:
        from cqrs.processor.partition import run_task

        s = self.settings
        serve_until = None
        if partition.serve_until is not None:
            serve_until = time.monotonic() + max(0.0, partition.serve_until - time.time())
        worker = worker_for(s.cfg, s.opts)
        positions = worker.table.positions(worker.generation, s.topic)
        ranges = claim_share(worker, partition, positions)
        stop_file = s.stop_file
        total = run_task(worker, s.topic, ranges, serve_until, positions=positions,
                         stopping=None if stop_file is None else partial(os.path.exists, stop_file))
        yield tuple(getattr(total, f) for f in STATS_FIELDS)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._offsets is not None:
            self._offsets.close()
            self._offsets = None
        if self.settings.stop_file is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.settings.stop_file)


class CommandSource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("cqrs-commands")``, its settings in one option."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return STATS_SCHEMA

    def streamReader(self, schema: Any) -> CommandReader:  # noqa: N802
        return CommandReader(_settings(self.options))


def claim_share(worker: Worker, task: Slices, positions: dict[int, Position]) -> dict[int, tuple[int, int]]:
    """The share ``task`` processes: the one it holds already (a retry of the task), else the
    free one with most partitions whose position this worker wrote (its cache holds their
    states), its own share first among equals. Each share is taken by one task through a
    lightweight transaction; there are as many shares as tasks, so every task finds one.

    A task's first attempt holds nothing yet (a plan id is new with each run of the query), so
    it goes straight to the transactions, whose answer names the holder of a share taken; a
    retried task first reads the claims at serial consistency, to take the share it held."""
    if task.plan is None or task.shares is None:
        return task.ranges
    table, generation = worker.table, worker.generation
    held: dict[int, int] = {}
    if _attempt() != 0:
        held = table.claims(generation, task.plan, len(task.shares))
        for share, holder in held.items():
            if holder == task.index:
                return task.shares[share]

    def mine(share: dict[int, tuple[int, int]]) -> int:
        return sum(1 for p in share if p in positions and positions[p].owner == worker.token)

    order = sorted(range(len(task.shares)), key=lambda k: (-mine(task.shares[k]), k != task.index, k))
    for share in order:
        if share not in held and table.claim(generation, task.plan, share, task.index):
            return task.shares[share]
    raise SourceError(
        f"task {task.index} of micro-batch {task.plan} found every share of its partitions "
        f"taken by other tasks ({held}); the task is retried")


def _attempt() -> int | None:
    """Which attempt of its Spark task this is (0: the first), ``None`` outside a task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return None
    return ctx.attemptNumber()


def _partitions_of(offsets: dict) -> dict:
    """A source offset without its :data:`TICK` and :data:`TOPIC`: ``{partition: offset}``."""
    return {p: o for p, o in offsets.items() if p != TICK and p != TOPIC}


def _capped(start: dict, ends: dict, max_rows: int) -> dict:
    """End offsets taking at most ``max_rows`` records in all, shared out in proportion to what
    each partition has waiting (each waiting partition gets at least one)."""
    waiting = {p: ends[p] - int(start.get(p, 0)) for p in ends}
    total = sum(w for w in waiting.values() if w > 0)
    if total <= max_rows:
        return ends
    return {p: int(start.get(p, 0)) + (max(1, w * max_rows // total) if w > 0 else 0)
            for p, w in waiting.items()}
