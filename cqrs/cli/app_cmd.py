"""``cqrs run app <module:app>``: everything an app runs, as streaming queries of one Spark
driver (the command processor and every projection's projector), each on the checkpoint the
separate ``cqrs run processor`` / ``cqrs run projector`` use, restarted one by one when it
fails; with ``/metrics``, ``/status.json`` and the status page on ``[metrics] port``."""

from __future__ import annotations

import argparse
import datetime as _dt
import threading
from pathlib import Path
from typing import Any

from cqrs.cli.run_cmd import job_parsers
from cqrs.config import CqrsConfig

__all__ = ["build_runner", "register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run_app = job_parsers(commands).add_parser(
        "app", help="the processor, projectors, process managers, retry job, deadline timer "
        "and history job of an app in one Spark driver",
        description="Each part is its own streaming query on its usual checkpoint (switching "
        "between this and the separate `run processor` / `run projector` is safe while the "
        "other is stopped); a query that fails is restarted after a back-off "
        "([metrics] restart_backoff_s, doubling), the others keep running; one refused because "
        "the app's classes cannot read the stored schemas is not restarted (state 'refused'). "
        "Serves /metrics, /status.json and a status page on [metrics] host:port.")
    run_app.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    run_app.add_argument("--trigger", default=None, metavar="INTERVAL",
                         help="micro-batch interval of every query, e.g. '1 second' "
                         "(default: back to back)")
    run_app.add_argument("--no-projectors", action="store_true", help="run the processor only")
    run_app.add_argument("--no-retrier", action="store_true",
                         help="do not run the retry job (it runs when the app declares "
                         "transient errors: App(retries=RetryPolicy(transient=[...])))")
    run_app.add_argument("--no-process-managers", action="store_true",
                         help="do not run the app's process managers")
    run_app.add_argument("--no-history", action="store_true",
                         help="do not run the history job (an aggregate's events and its state "
                         "at a version or time then wait for a `cqrs run history`)")
    run_app.add_argument("--no-scheduler", action="store_true",
                         help="do not run the deadline timer (deadlines handlers schedule then "
                         "wait for a `cqrs run scheduler`)")
    run_app.set_defaults(run=_run_app)


def _say(message: str) -> None:
    stamp = _dt.datetime.now().strftime("%H:%M:%S")
    print(f"{stamp} {message}", flush=True)


class Runner:
    """What ``cqrs run app`` holds: the board, its probes and server, and the supervisor."""

    def __init__(self, board: Any, supervisor: Any, poller: Any, server: Any,
                 spark: Any) -> None:
        self.board = board
        self.supervisor = supervisor
        self.poller = poller
        self.server = server
        self.spark = spark

    def run(self, stop: threading.Event | None = None) -> None:
        try:
            self.supervisor.run(stop)
        finally:
            self.poller.stop()
            if self.server is not None:
                self.server.close()


def build_runner(cfg: CqrsConfig, app_ref: str, *, trigger: str | None = None,
                 projectors: bool = True, retrier: bool = True, process_managers: bool = True,
                 scheduler: bool = True, history: bool = True, report: Any = _say) -> Runner:
    """Start the Spark session, the listener, the probes and the server of ``app_ref``; the
    queries start with :meth:`Runner.run`."""
    import os

    from cqrs.loading import load_app
    from cqrs.ops.board import StatusBoard
    from cqrs.ops.kafka_probe import KafkaProbe, Poller
    from cqrs.ops.listener import attach_listener
    from cqrs.ops.memory import children, rss_bytes
    from cqrs.ops.server import StatusServer
    from cqrs.ops.supervisor import QuerySpec, Supervisor
    from cqrs.personal.stack import key_store_for
    from cqrs.processor.job import checkpoint_for, start_processor
    from cqrs.processor.workers import ProcessorOptions
    from cqrs.processor.partition import SliceStats
    from cqrs.processor.source import new_stop_file
    from cqrs.spark_session import spark_session
    from cqrs.topics import topics_for
    from projections.model import select
    from projections.status_probe import ProjectionProbe
    from projections.store import table_base
    from projections.stores import cached_store

    app = load_app(app_ref)
    # personal fields: the key store opens now, so a missing master key stops the runner here
    # (every query would fail to start on it, and be restarted for ever)
    key_store_for(cfg, app)
    topics = topics_for(app.name, cfg.kafka.topic_prefix)
    board = StatusBoard(app.name)
    spark = spark_session(cfg, f"cqrs-app-{app.name}")
    attach_listener(spark, board)

    def on_processor_batch(batch_id: int, s: SliceStats) -> None:
        board.batch_rows("processor", batch_id, s.commands)  # Spark counts a row per task
        board.count(commands_in=s.commands, commands_skipped=s.skipped, records_out=s.records,
                    dead_letters_written=s.dead_letters, read_s=s.read_s, step_s=s.step_s,
                    produce_s=s.produce_s, write_s=s.write_s, cpu_s=s.cpu_s,
                    deadlines_scheduled=s.deadlines_scheduled,
                    deadlines_cancelled=s.deadlines_cancelled,
                    decisions_set_aside=s.set_aside, decisions_timed_out=s.timed_out)
        board.set_running_long(s.lanes_open, s.longest_decision, s.longest_decision_s)

    stop_file = new_stop_file()

    def start_proc(_: int | None) -> Any:
        opts = ProcessorOptions(app_ref=app_ref, checkpoint=checkpoint_for(cfg, app.name),
                                trigger_interval=trigger)
        return start_processor(spark, cfg, opts, on_batch=on_processor_batch, stop_file=stop_file)

    specs = [QuerySpec("processor", "processor", topics.commands, start_proc,
                       drain=Path(stop_file).touch)]
    store = cached_store(cfg) if projectors and app.projections else None
    for p in select(app, ()) if store is not None else []:
        specs.append(_projector_spec(spark, cfg, app_ref, p, store, trigger, board,
                                     topics.events, table_base(app.name, p.name)))
    if retrier and app.retries.transient:
        specs.append(_retrier_spec(spark, cfg, app_ref, board, topics.dead_letters))
    if process_managers:
        specs += [_process_manager_spec(cfg, app_ref, pm.name, board, topics.events)
                  for pm in app.process_managers]
    if scheduler:
        specs.append(_scheduler_spec(cfg, app_ref, board, topics.commands))
    if history:
        specs.append(_history_spec(cfg, app_ref, board, topics.events))

    jvm_pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())  # noqa: SLF001

    def memory() -> None:
        workers = children(jvm_pid)
        board.set_memory({"driver_jvm": rss_bytes(jvm_pid), "python_driver": rss_bytes(os.getpid()),
                          "python_workers": sum(rss_bytes(w) for w in workers)})

    probes: list[Any] = [KafkaProbe(cfg, topics, board), memory]
    if app.projections:
        probes.append(ProjectionProbe(cfg, app, board, topics.events))
    poller = Poller(board, probes, cfg.metrics.refresh_s).start()
    server = None
    if cfg.metrics.port:
        server = StatusServer(board.snapshot, cfg.metrics.host, cfg.metrics.port).start()
        report(f"status of {app.name!r}: {server.url}/ (JSON: /status.json, Prometheus: /metrics)")
    supervisor = Supervisor(board, specs, backoff_s=cfg.metrics.restart_backoff_s, report=report)
    return Runner(board, supervisor, poller, server, spark)


def _projector_spec(spark: Any, cfg: CqrsConfig, app_ref: str, projection: Any, store: Any,
                    trigger: str | None, board: Any, events_topic: str, base: str) -> Any:
    """The projector of one projection, on its current generation (as `run projector`)."""
    from cqrs.ops.supervisor import QuerySpec
    from projections.job import ProjectorOptions, start_projector
    from projections.local import ensure_current_generation

    name = projection.name

    def on_batch(batch_id: int, s: Any) -> None:
        board.count_projector(name, events=s.events, applied=s.applied,
                              dead_letters=s.dead_letters)

    def generation() -> int | None:
        current = store.generations(base).current
        return current if current is not None else ensure_current_generation(store, projection, base)

    def start(gen: int | None) -> Any:
        assert gen is not None
        store.ensure_generation(projection, base, gen)
        return start_projector(spark, cfg, ProjectorOptions(app_ref, name, trigger_interval=trigger), gen,
                               on_batch=on_batch)

    return QuerySpec(f"projector:{name}", "projector", events_topic, start, generation)


def _retrier_spec(spark: Any, cfg: CqrsConfig, app_ref: str, board: Any, topic: str) -> Any:
    """The retry job (as `run retrier`): its dead-letter query and its timer."""
    from cqrs.ops.supervisor import QuerySpec
    from cqrs.retrier.job import RetrierOptions, start_retrier

    def on_ingest(_: int, s: Any) -> None:
        board.count(letters_recorded=s.letters, letters_parked=s.parked)

    def on_round(s: Any) -> None:
        board.count(retries_delivered=s.delivered + s.found_delivered)

    def start(_: int | None) -> Any:
        return start_retrier(spark, cfg, RetrierOptions(app_ref), on_ingest=on_ingest,
                             on_round=on_round)

    return QuerySpec("retrier", "retrier", topic, start)


def _process_manager_spec(cfg: CqrsConfig, app_ref: str, name: str, board: Any,
                          events_topic: str) -> Any:
    """One process manager (as `run process-manager`): it serves the events topic beside the
    Spark queries, supervised as they are."""
    from cqrs.ops.supervisor import QuerySpec
    from cqrs.process.job import ProcessManagerOptions, start_process_manager

    def on_batch(_: int, r: Any) -> None:
        board.count(reactions=r.reacted, reaction_commands=r.commands,
                    reaction_failures=r.failures, conversations_ended=r.outcomes,
                    reaction_cpu_s=r.cpu_s)

    def start(_: int | None) -> Any:
        return start_process_manager(cfg, ProcessManagerOptions(app_ref, name),
                                     on_batch=on_batch, on_progress=board.on_progress)

    return QuerySpec(f"process-manager:{name}", "process-manager", events_topic, start)


def _scheduler_spec(cfg: CqrsConfig, app_ref: str, board: Any, commands_topic: str) -> Any:
    """The deadline timer (as `run scheduler`), supervised beside the Spark queries."""
    from cqrs.ops.supervisor import QuerySpec
    from cqrs.scheduler.job import SchedulerOptions, start_scheduler

    def on_round(r: Any) -> None:
        board.count(deadlines_fired=r.fired, deadlines_dropped=r.stale,
                    deadline_lateness_s=sum(r.lateness_s))

    def on_progress(query_id: str, p: Any) -> None:
        board.on_progress(query_id, p)
        board.set_gauges(deadlines_waiting=p.get("deadlinesWaiting"))

    def start(_: int | None) -> Any:
        return start_scheduler(cfg, SchedulerOptions(app_ref), on_round=on_round,
                               on_progress=on_progress)

    return QuerySpec("scheduler", "scheduler", commands_topic, start)


def _history_spec(cfg: CqrsConfig, app_ref: str, board: Any, events_topic: str) -> Any:
    """The history job (as `run history`): events -> the history table, beside the queries."""
    from cqrs.history.job import HistoryOptions, start_history
    from cqrs.ops.supervisor import QuerySpec

    def on_batch(_: int, r: Any) -> None:
        board.count(history_rows=r.events)

    def start(_: int | None) -> Any:
        return start_history(cfg, HistoryOptions(app_ref), on_batch=on_batch,
                             on_progress=board.on_progress)

    return QuerySpec("history", "history", events_topic, start)


def _run_app(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    import signal

    runner = build_runner(cfg, args.app, trigger=args.trigger, projectors=not args.no_projectors,
                          retrier=not args.no_retrier,
                          process_managers=not args.no_process_managers,
                          scheduler=not args.no_scheduler, history=not args.no_history)
    stop = threading.Event()
    # SIGTERM (systemd, Kubernetes, kill) stops the queries between batches, like Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        runner.run(stop)
    except KeyboardInterrupt:
        pass
    _say("stopped")
    return 0
