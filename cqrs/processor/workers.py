"""A processor's options and the worker each Python process builds from them.

Both sides of the Spark job need these: the driver (:mod:`cqrs.processor.job`) fills in the
options and starts the query; the tasks (:mod:`cqrs.processor.source`) carry the options to
the workers and build (once per process) the :class:`~cqrs.processor.partition.Worker` that
processes their slices. Kept apart from both, so neither imports the other.
"""

from __future__ import annotations

import threading

import attrs

from cqrs.config import CqrsConfig
from cqrs.config import cache_key as config_key
from cqrs.processor.partition import Worker
from cqrs.processor.step import AggregateStep, DedupPolicy
from cqrs.topics import AppTopics, topics_for

__all__ = ["ProcessorOptions", "step_for", "worker_for"]


@attrs.frozen
class ProcessorOptions:
    """What one processor query needs besides the configuration."""

    app_ref: str  # "module:attribute" of the App, importable on every executor
    topics: AppTopics | None = None  # default: topics_for(app.name, kafka.topic_prefix)
    checkpoint: str | None = None  # default: <checkpoint_dir>/<topic prefix><app>/processor
    dedup: DedupPolicy = DedupPolicy()
    max_offsets_per_trigger: int | None = None
    trigger_interval: str | None = None  # e.g. "500 milliseconds"; None: as fast as possible
    # partitions of the results topic, so a command's reply partition can be honoured; filled
    # in by start_processor from the topic's metadata
    results_partitions: int | None = None
    # generation of the aggregate-state table; filled in by start_processor (the current one)
    state_generation: int | None = None


# Executors build a worker once per Python worker process and reuse it across batches.
_WORKERS: dict[str, Worker] = {}
_WORKERS_LOCK = threading.Lock()


def step_for(cfg: CqrsConfig, opts: ProcessorOptions) -> AggregateStep:
    """The app's step with its codec bound to the Kafka schema store (built once per process)."""
    return worker_for(cfg, opts, with_io=False).step


def worker_for(cfg: CqrsConfig, opts: ProcessorOptions, with_io: bool = True) -> Worker:
    """This process's worker for a processor (``with_io``: with its state table and producer)."""
    cache_key = config_key(cfg, opts, with_io)
    with _WORKERS_LOCK:
        worker = _WORKERS.get(cache_key)
        if worker is None:
            from cqrs.codec.kafka_schema_store import KafkaSchemaStore
            from cqrs.kafka_io import make_producer
            from cqrs.loading import load_app
            from cqrs.personal.stack import key_store_for
            from cqrs.processor.state_table import open_state_table

            app = load_app(opts.app_ref)
            topics = opts.topics or topics_for(app.name, cfg.kafka.topic_prefix)
            store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, topics.schemas,
                                     cfg.kafka.client_options())
            codec = app.codec_for(store, key_store=key_store_for(cfg, app))
            step = AggregateStep(app, codec, topics, opts.dedup,
                                 results_partitions=opts.results_partitions,
                                 max_record_bytes=cfg.kafka.max_record_bytes())
            table = open_state_table(cfg, topics) if with_io else None
            generation = opts.state_generation or 0
            worker = Worker(cfg, step, table, generation, None)  # type: ignore[arg-type]
            if with_io:
                # only failed deliveries call back: a report per record cost a Python call and
                # a message object each, two per command
                worker.producer = make_producer(cfg, **{"linger.ms": 2, "on_delivery": worker.on_delivery,
                                                        "delivery.report.only.error": True})
            _WORKERS[cache_key] = worker
        return worker
