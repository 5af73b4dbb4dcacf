"""``cqrs run retrier``: the retry job as a Spark Structured Streaming query and a timer.

The query reads the app's dead-letters topic (checkpointed, like the processor and projectors)
and hands each micro-batch to :meth:`cqrs.retrier.service.Retrier.ingest` in the driver (dead
letters are few; their state lives in Cassandra). The timer is a thread of the same driver
that calls :meth:`~cqrs.retrier.service.Retrier.deliver_due` every ``[retrier] interval_s``.
:func:`start_retrier` returns a :class:`RetrierQuery`: the query and the timer, active while
both are, so ``cqrs run app``'s supervisor restarts them together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.kafka_io import KafkaRecord
from cqrs.spark_session import with_trigger
from cqrs.topics import AppTopics, ensure_topics, topics_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cqrs.retrier.service import DeliverStats, IngestStats, Retrier

__all__ = ["RetrierOptions", "RetrierQuery", "checkpoint_for", "start_retrier"]


@attrs.frozen
class RetrierOptions:
    """One retry job: which app, where its checkpoint is, how often it looks."""

    app_ref: str  # "module:attribute"
    topics: AppTopics | None = None  # default: topics_for(app.name, kafka.topic_prefix)
    checkpoint: str | None = None  # default: <checkpoint_dir>/<app>/retrier
    trigger_interval: str | None = None  # default: [retrier] trigger
    interval_s: float | None = None  # default: [retrier] interval_s


def checkpoint_for(cfg: CqrsConfig, app_name: str) -> str:
    return cfg.spark.checkpoint_location(app_name, "retrier")


class RetrierQuery:
    """The dead-letter query and the timer thread, seen as one streaming query."""

    def __init__(self, query: Any, retrier: Retrier, interval_s: float,
                 on_round: Callable[[DeliverStats], None] | None) -> None:
        self.query = query
        self.retrier = retrier
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._on_round = on_round
        self._thread = threading.Thread(target=self._loop, name="cqrs-retrier-timer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self._interval_s):
                if not self.query.isActive:
                    return
                stats = self.retrier.deliver_due()
                if self._on_round is not None:
                    self._on_round(stats)
        except BaseException as exc:  # noqa: BLE001 - reported through exception()
            self.error = exc
            try:
                self.query.stop()
            except Exception:  # noqa: BLE001, S110 - stopping is best effort here
                pass

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        return bool(self.query.isActive) and self._thread.is_alive()

    def exception(self) -> Any:
        return self.error if self.error is not None else self.query.exception()

    def stop(self) -> None:
        self._stop.set()
        self.query.stop()
        self._thread.join(timeout=max(30.0, self._interval_s * 2))
        self.retrier.close()

    def awaitTermination(self, timeout: float | None = None) -> Any:  # noqa: N802
        return self.query.awaitTermination(timeout) if timeout else self.query.awaitTermination()

    def __getattr__(self, name: str) -> Any:  # id, runId, name, lastProgress...
        return getattr(self.query, name)


def _records(frame: DataFrame) -> list[KafkaRecord]:
    rows = frame.selectExpr("topic", "partition", "offset", "key", "value", "headers",
                            "unix_millis(timestamp) AS ts").collect()
    return [KafkaRecord(r.topic, r.partition, r.offset,
                        None if r.key is None else bytes(r.key),
                        None if r.value is None else bytes(r.value),
                        [(h.key, bytes(h.value or b"")) for h in (r.headers or [])],
                        r.ts) for r in rows]


def start_retrier(spark: SparkSession, cfg: CqrsConfig, opts: RetrierOptions, *,
                  on_ingest: Callable[[int, IngestStats], None] | None = None,
                  on_round: Callable[[DeliverStats], None] | None = None) -> RetrierQuery:
    """Start the retry job of ``opts.app_ref``: its query and its timer."""
    from cqrs.loading import load_app
    from cqrs.retrier.service import Retrier

    app = load_app(opts.app_ref)
    topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    retrier = Retrier(cfg, app, topics)
    source = (spark.readStream.format("kafka").options(**cfg.kafka.spark_options())
              .option("subscribe", topics.dead_letters)
              .option("startingOffsets", "earliest")
              .option("includeHeaders", "true")
              .option("failOnDataLoss", "true")
              .option("maxOffsetsPerTrigger", str(cfg.retrier.max_letters_per_trigger))
              .load())

    def batch(frame: DataFrame, batch_id: int) -> None:
        stats = retrier.ingest(_records(frame))
        if on_ingest is not None:
            on_ingest(batch_id, stats)

    trigger = opts.trigger_interval if opts.trigger_interval is not None else cfg.retrier.trigger
    writer = (source.writeStream.foreachBatch(batch)
              .option("checkpointLocation", opts.checkpoint or checkpoint_for(cfg, app.name))
              .queryName(f"cqrs-retrier-{topics.base}"))
    query = with_trigger(writer, interval=trigger or None).start()
    interval = opts.interval_s if opts.interval_s is not None else cfg.retrier.interval_s
    return RetrierQuery(query, retrier, interval, on_round)
