"""The scheduler's timer: every ``[scheduler] interval_s`` it reads what is due (a slice of the
due table from its cursor to now, see :mod:`cqrs.scheduler.store`), sends each due deadline's
command to the commands topic, waits until Kafka acknowledged them, then deletes their entries
and moves its cursor past them.

A crash between sending and deleting sends those commands again at the restart, with the same
ids (``dl:<owner>:<name>:<due ms>``): the processor answers a second firing with the first
result (its dedup) and applies nothing twice. A deadline cancelled or moved before its time has
no row at that time any more, so its entry is dropped without firing. The job is a thread
(:class:`~cqrs.loops.LoopQuery`): it runs inside ``cqrs run app`` or alone as
``cqrs run scheduler``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.loops import LoopQuery
from cqrs.topics import AppTopics, ensure_topics, topics_for

__all__ = ["RoundStats", "SchedulerError", "SchedulerOptions", "SchedulerQuery", "start_scheduler"]

CURSOR_SAVE_S = 10.0  # an idle timer saves its cursor this often


class SchedulerError(CqrsError, RuntimeError):
    """Kafka did not take the due commands (the job fails; its restart sends them again)."""


@attrs.frozen
class SchedulerOptions:
    app_ref: str  # "module:attribute" of the App
    topics: AppTopics | None = None  # default: topics_for(app.name, kafka.topic_prefix)
    interval_s: float | None = None  # default: [scheduler] interval_s


@attrs.define
class RoundStats:
    fired: int = 0
    stale: int = 0  # entries of deadlines cancelled or moved since
    lateness_s: list[float] = attrs.field(factory=list)  # due time -> sent, per fired deadline
    seconds: float = 0.0


class SchedulerQuery(LoopQuery):
    """The timer of one app's deadlines (see the module doc)."""

    def __init__(self, cfg: CqrsConfig, topics: AppTopics, interval_s: float,
                 on_round: Callable[[RoundStats], None] | None,
                 on_progress: Callable[[str, Mapping[str, Any]], None] | None) -> None:
        super().__init__(f"cqrs-scheduler-{topics.base}", on_progress)
        self.cfg = cfg
        self.topics = topics
        self.interval_s = interval_s
        self._on_round = on_round
        self.store: Any = None
        self._producer: Any = None
        self._cursor = 0
        self._rounds = 0  # rounds done
        self._saved_at = 0.0  # when the cursor was last saved (time.monotonic())

    def _serve(self) -> None:
        from cqrs.kafka_io import make_producer
        from cqrs.scheduler.store import open_deadline_store

        self.store = open_deadline_store(self.cfg, self.topics.base)
        self._producer = make_producer(self.cfg, **{"linger.ms": 1})
        try:
            self._cursor = self.store.cursor() or int(time.time() * 1000)
            self._ready()
            period = RoundStats()
            reported = time.monotonic()
            while not self._stop.is_set():
                started = time.monotonic()
                stats = self.run_round()
                self._rounds += 1
                if self._on_round is not None and (stats.fired or stats.stale):
                    self._on_round(stats)
                period.fired += stats.fired
                period.stale += stats.stale
                period.lateness_s += stats.lateness_s
                period.seconds += stats.seconds
                now = time.monotonic()
                if now - reported >= (1.0 if period.fired else 10.0):
                    self._progress(period, now - reported)
                    period, reported = RoundStats(), now
                if stats.fired < self.cfg.scheduler.max_due_per_round:  # else: more due, at once
                    self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            self._producer.flush(30)
            self.store.close()

    def processAllAvailable(self, timeout: float = 600.0) -> None:  # noqa: N802
        """Wait until every deadline due at the call is sent (a round started after it ended)."""
        self._started.wait(timeout)
        target = self._rounds + 2  # the running round may have read before the call
        deadline = time.monotonic() + timeout
        while self._rounds < target:
            if self._error is not None:
                raise self._error
            if not self.isActive or time.monotonic() > deadline:
                raise SchedulerError(f"{self.name} stopped or took over {timeout:g} s for a round")
            time.sleep(0.02)

    def run_round(self, now_ms: int | None = None) -> RoundStats:
        """One round: send what is due at ``now_ms`` (default: now)."""
        started = time.perf_counter()
        now = int(time.time() * 1000) if now_ms is None else now_ms
        fire, entries, after = self.store.due(self._cursor, now, self.cfg.scheduler.max_due_per_round)
        stats = RoundStats(fired=len(fire), stale=len(entries) - len(fire))
        produce = self._producer.produce
        for d in fire:
            while True:
                try:
                    produce(self.topics.commands, key=d.key, value=d.value)
                    break
                except BufferError:
                    self._producer.poll(0.05)
        if fire:
            left = self._producer.flush(60)
            if left:
                raise SchedulerError(
                    f"Kafka did not acknowledge {left} of {len(fire)} due commands within 60 s "
                    f"(is {self.cfg.kafka.bootstrap_servers} reachable?); they are sent again "
                    "when the scheduler restarts")
            sent = time.time() * 1000
            stats.lateness_s = [(sent - (d.due_ms or sent)) / 1000.0 for d in fire]
        self.store.forget(entries)
        self._cursor = after
        # an idle round moves the cursor too; saving it every round would be a write per round
        # for nothing (a restart from an older cursor only reads empty slices again)
        if entries or time.monotonic() - self._saved_at > CURSOR_SAVE_S:
            self.store.save_cursor(after)
            self._saved_at = time.monotonic()
        stats.seconds = time.perf_counter() - started
        return stats

    def _progress(self, period: RoundStats, elapsed: float) -> None:
        late = sorted(period.lateness_s)
        self._report({
            "numInputRows": period.fired,
            "inputRowsPerSecond": period.fired / max(elapsed, 1e-6),
            "processedRowsPerSecond": period.fired / max(period.seconds, 1e-6) if period.fired else 0.0,
            "durationMs": {"triggerExecution": period.seconds * 1000.0},
            "sources": [],
            "fired": period.fired, "stale": period.stale,
            "latenessP50Seconds": late[len(late) // 2] if late else None,
            "latenessMaxSeconds": late[-1] if late else None,
            "deadlinesWaiting": self.store.waiting(self._cursor),
        })


def start_scheduler(cfg: CqrsConfig, opts: SchedulerOptions, *,
                    on_round: Callable[[RoundStats], None] | None = None,
                    on_progress: Callable[[str, Mapping[str, Any]], None] | None = None,
                    ) -> SchedulerQuery:
    """Start the deadline timer of ``opts.app_ref`` (see the module doc)."""
    from cqrs.loading import load_app

    app = load_app(opts.app_ref)
    topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    interval = opts.interval_s if opts.interval_s is not None else cfg.scheduler.interval_s
    query = SchedulerQuery(cfg, topics, interval, on_round, on_progress)
    query.start()
    return query
