"""Keep an app's projector queries running, one per projection, and follow generation switches:
when a rebuild makes another generation current, the query of the old one stops and the new
generation's query starts from the checkpoint the rebuild left."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from cqrs.config import CqrsConfig
from cqrs.loading import load_app
from projections.apply import BatchStats
from projections.errors import ProjectionError
from projections.job import ProjectorOptions, start_projector
from projections.local import ensure_current_generation
from projections.model import select
from projections.store import table_base
from projections.stores import cached_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ProjectorFailed", "run_projectors"]

Report = Callable[[str], None]


class ProjectorFailed(ProjectionError, RuntimeError):
    """A projector query stopped with an error (the message carries Spark's)."""


def run_projectors(spark: SparkSession, cfg: CqrsConfig, app_ref: str, names: Sequence[str] = (),
                   *, available_now: bool = False, stop: threading.Event | None = None,
                   report: Report = print, poll_s: float = 1.0, topic_prefix: str | None = None,
                   trigger_interval: str | None = None) -> None:
    """Run the projections (all when ``names`` is empty) until ``stop`` is set, or, with
    ``available_now``, until every one has applied what the events topic held at its start."""
    app = load_app(app_ref)
    store = cached_store(cfg)
    running: dict[str, tuple[int, Any]] = {}

    def printer(name: str, gen: int) -> Callable[[int, BatchStats], None]:
        started = time.monotonic()

        def on_batch(batch_id: int, s: BatchStats) -> None:
            nonlocal started
            now = time.monotonic()
            rate = s.events / max(now - started, 1e-6)
            started = now
            report(f"{name} g{gen} batch {batch_id}: {s.events} events, {s.applied} applied, "
                   f"{s.aggregates} aggregates, {s.dead_letters} dead letters, {rate:,.0f} events/s")
        return on_batch

    def start(name: str, generation: int) -> None:
        opts = ProjectorOptions(app_ref, name, topic_prefix=topic_prefix,
                                trigger_interval=trigger_interval)
        query = start_projector(spark, cfg, opts, generation, available_now=available_now,
                                on_batch=printer(name, generation))
        running[name] = (generation, query)
        report(f"projector {app.name}/{name} running on generation {generation}")

    for p in select(app, names):
        start(p.name, ensure_current_generation(store, p, table_base(app.name, p.name)))
    try:
        while running and not (stop is not None and stop.is_set()):
            for p in select(app, list(running)):
                generation, query = running[p.name]
                base = table_base(app.name, p.name)
                current = store.generations(base).current
                if current is not None and current != generation:
                    report(f"{p.name}: generation {current} is current now; switching to it")
                    query.stop()
                    store.ensure_generation(p, base, current)
                    start(p.name, current)
                    continue
                if not query.isActive:
                    error = query.exception()
                    if error is not None:
                        raise ProjectorFailed(f"projector {app.name}/{p.name} g{generation} "
                                              f"failed: {error}")
                    del running[p.name]  # available_now: done
            time.sleep(poll_s)
    finally:
        for _, query in running.values():
            if query.isActive:
                query.stop()
