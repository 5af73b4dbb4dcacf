"""Rebuild a projection into a new generation while readers keep using the current one.

1. pick generation ``n + 1``, create its tables, record it as *building*;
2. snapshot the events topic's end offsets; batch-read the log up to them in chunks (Spark
   batch jobs, the same executor-side fold as the projector), printing events, events/s, ETA.
   A task per core reads its share of the partitions' ranges with librdkafka, a progress line
   every 2 s from the positions the tasks save (:func:`~projections.job.apply_ranges`);
   a re-keyed projection, whose views gather events of every partition, goes through Spark's
   Kafka source and a shuffle by view key instead;
3. catch up with what was written meanwhile (one more batch job over that short range) and
   save the generation's positions: a projector started on it continues from them (no
   streaming query runs during the rebuild: starting one cost ~0.6 s);
4. switch readers: one metadata write makes ``n + 1`` current (running projectors follow);
5. after a grace period, drop generation ``n``'s tables (``[projections] drop_old_generation``).

A rebuild cannot destroy the generation readers use: it is refused before step 1 when the app's
classes cannot read the stored schemas (the processor's check), and when steps 2-3 dead-lettered
events it stops before step 4 (:class:`~projections.errors.RebuildDeadLettersError`; readers
stay on ``n``, nothing is dropped) unless ``allow_dead_letters``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from cqrs.config import CqrsConfig
from cqrs.loading import load_app
from cqrs.topics import topics_for
from projections.apply import BatchStats
from projections.dlq import dead_letter_topic, ensure_dead_letter_topic
from projections.errors import GenerationError, RebuildDeadLettersError
from projections.job import (
    ProjectorOptions, apply_frame, apply_ranges, check_schemas, checkpoint_for, event_frame,
    offsets_json, start_warming,
)
from projections.model import Projection, RekeyedProjection, find_projection
from projections.positions import topic_offsets
from projections.records import Generations
from projections.store import table_base
from projections.stores import cached_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["RebuildReport", "check_rebuild", "rebuild_projection"]

Report = Callable[[str], None]


@attrs.frozen
class RebuildReport:
    projection: str
    old_generation: int | None
    new_generation: int
    events: int
    seconds: float
    dropped_old: bool
    dead_letters: int = 0  # events dead-lettered into the new generation (allow_dead_letters)


def check_rebuild(cfg: CqrsConfig, app_ref: str, name: str, *, topic_prefix: str | None = None,
                  force: bool = False) -> Generations:
    """Refuse a rebuild before any work, without Spark: another one under way (unless
    ``force``), or stored events the app's classes cannot read
    (:class:`~cqrs.errors.IncompatibleSchemaError`, readers staying where they are). The
    projection's generations as they stand."""
    app = load_app(app_ref)
    find_projection(app, name)
    gens = cached_store(cfg).generations(table_base(app.name, name))
    if gens.building is not None and not force:
        raise GenerationError(
            f"a rebuild of {name!r} into generation {gens.building} is under way or was "
            "interrupted; wait for it, or pass --force to start over with a new generation"
        )
    prefix = cfg.kafka.topic_prefix if topic_prefix is None else topic_prefix
    check_schemas(cfg, topics_for(app.name, prefix), app,
                  f"not rebuilding {app.name}/{name} ({_readers_on(gens.current)})")
    return gens


def rebuild_projection(spark: SparkSession, cfg: CqrsConfig, app_ref: str, name: str, *,
                       report: Report = print, drop_old: bool | None = None,
                       topic_prefix: str | None = None, force: bool = False,
                       allow_dead_letters: bool = False) -> RebuildReport:
    """Rebuild projection ``name`` of the app ``app_ref`` into a new generation (see the module
    doc). ``allow_dead_letters``: switch readers to it (and drop the old one) even when events
    were dead-lettered into it; otherwise that raises :class:`RebuildDeadLettersError`."""
    app = load_app(app_ref)
    projection = find_projection(app, name)
    store = cached_store(cfg)
    base = table_base(app.name, name)
    prefix = cfg.kafka.topic_prefix if topic_prefix is None else topic_prefix
    topics = topics_for(app.name, prefix)
    events_topic = topics.events
    opts = ProjectorOptions(app_ref, name, topic_prefix=prefix)
    # Spark's Python workers start and load the app while the checks run and the tables are made
    warming = start_warming(spark, cfg, opts) if not isinstance(projection, RekeyedProjection) else None
    gens = check_rebuild(cfg, app_ref, name, topic_prefix=topic_prefix, force=force)
    old = gens.current
    new = max(old or 0, gens.building or 0) + 1
    store.ensure_generation(projection, base, new)
    store.set_generations(base, Generations(old, new))
    report(f"rebuilding {app.name}/{name} into generation {new} (readers stay on {old})")

    started = time.monotonic()
    # the batch jobs write dead letters too: to a topic the projector may never have created
    ensure_dead_letter_topic(cfg, dead_letter_topic(app.name, prefix))
    if warming is not None:
        warming.join()
    fold = _RangeFold(spark, cfg, opts, projection, base, new, events_topic, report, started)
    ends = topic_offsets(cfg, events_topic)
    end = {p: high for p, (_, high) in ends.items()}
    fold.run({p: low for p, (low, _) in ends.items()}, end, progress=True)
    # catch up with what was written meanwhile (a short range, once): a running projector
    # continues from the positions saved below, so readers switch to a generation that is
    # at most that far behind
    now = topic_offsets(cfg, events_topic)
    if any(high > end.get(p, low) for p, (low, high) in now.items()):
        fold.run({p: end.get(p, low) for p, (low, _) in now.items()},
                 {p: high for p, (_, high) in now.items()}, progress=False)
        end = {p: high for p, (_, high) in now.items()}
    store.save_positions(base, new, end)
    # a checkpoint left by an interrupted rebuild into this generation would make a projector
    # continue from it instead of from the positions just saved
    checkpoint = checkpoint_for(cfg, app.name, name, new)
    if Path(checkpoint).exists():
        shutil.rmtree(checkpoint)
    done = fold.done
    if done.dead_letters and not allow_dead_letters:
        raise RebuildDeadLettersError(app_ref, app.name, name, new, old, done.dead_letters,
                                      done.events)

    store.set_generations(base, Generations(new, None))
    seconds = time.monotonic() - started
    with_letters = f", {done.dead_letters:,} of them dead-lettered" if done.dead_letters else ""
    report(f"switched readers of {name!r} to generation {new}: {done.events:,} events"
           f"{with_letters} in {seconds:,.1f} s ({done.events / max(seconds, 1e-6):,.0f} events/s)")
    drop = cfg.projections.drop_old_generation if drop_old is None else drop_old
    if drop and old is not None:
        time.sleep(cfg.projections.drop_grace_s)  # readers and projectors move over first
        store.drop_generation(projection, base, old)
        old_checkpoint = checkpoint_for(cfg, app.name, name, old)
        if Path(old_checkpoint).exists():
            shutil.rmtree(old_checkpoint, ignore_errors=True)
        report(f"dropped generation {old}")
    return RebuildReport(name, old, new, done.events, seconds, bool(drop and old is not None),
                         done.dead_letters)


class _RangeFold:
    """Batch jobs folding ranges of the events topic into a generation, with progress lines."""

    def __init__(self, spark: SparkSession, cfg: CqrsConfig, opts: ProjectorOptions,
                 projection: Projection, base: str, generation: int, topic: str,
                 report: Report, started: float) -> None:
        self.spark, self.cfg, self.opts, self.projection = spark, cfg, opts, projection
        self.base, self.generation, self.topic = base, generation, topic
        self.report, self.started = report, started
        self.done = BatchStats()

    def run(self, position: dict[int, int], end: dict[int, int], *, progress: bool) -> None:
        """Fold ``[position[p], end[p])`` of every partition ``p``: in batch jobs of about
        ``[projections] rebuild_chunk_events``, every partition cut into as many equal steps (a
        partition longer than the others adds no job of its own); a progress line every few
        seconds (re-keyed projections: after each job)."""
        cfg, position = self.cfg, dict(position)
        total = sum(max(0, end[p] - position[p]) for p in end)
        rounds = max(1, -(-total // max(1, cfg.projections.rebuild_chunk_events)))
        step = {p: max(1, -(-(end[p] - position[p]) // rounds)) for p in end}
        direct = not isinstance(self.projection, RekeyedProjection)
        counted = self.done.events

        def line(folded: int) -> None:
            if progress and folded > 0:
                elapsed = time.monotonic() - self.started
                rate = folded / max(elapsed, 1e-6)
                eta = (total - folded) / rate if rate > 0 else float("inf")
                self.report(f"  {folded:,}/{total:,} events, {rate:,.0f} events/s, ETA "
                            f"{eta:,.0f} s, {self.done.dead_letters} dead letters")

        while any(position[p] < end[p] for p in end):
            upto = {p: min(end[p], position[p] + step[p]) for p in end}
            if direct:  # a task reads its partitions' ranges with librdkafka, as the processor does
                before = self.done.events - counted
                self.done.add(apply_ranges(
                    self.spark, cfg, self.opts, self.base, self.generation, self.topic,
                    {p: (position[p], upto[p]) for p in end},
                    on_progress=(lambda n, b=before: line(b + n)) if progress else None))
            else:  # a view's events come from every partition: Spark brings them together
                source = (self.spark.read.format("kafka").options(**cfg.kafka.spark_options())
                          .option("subscribe", self.topic)
                          .option("startingOffsets", offsets_json(self.topic, position))
                          .option("endingOffsets", offsets_json(self.topic, upto))
                          .option("includeHeaders", "true").load())
                self.done.add(apply_frame(event_frame(source), cfg, self.opts, self.base,
                                          self.generation))
            position = upto
            line(self.done.events - counted)


def _readers_on(generation: int | None) -> str:
    return (f"readers stay on generation {generation}" if generation is not None
            else "readers have no generation yet")
