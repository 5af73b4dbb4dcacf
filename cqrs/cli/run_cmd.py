"""``cqrs run processor <module:app>``: start the app's command processor and keep it running."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cqrs.config import CqrsConfig

__all__ = ["job_parsers", "register", "say", "serve_query"]

_JOBS = "cqrs_job_parsers"


def say(message: str) -> None:
    """A job's progress line, stamped with the local time."""
    import datetime as _dt

    print(f"{_dt.datetime.now():%H:%M:%S} {message}", flush=True)


def serve_query(query: Any, drain: Callable[[], object] | None = None) -> int:
    """Keep a job's streaming query running until it ends, SIGTERM or Ctrl-C; stop it between
    batches (``drain``: see :func:`~cqrs.spark_session.stop_between_batches`) and return the exit
    code (1 when the query failed, with its error said)."""
    import signal
    import threading

    from py4j.protocol import Py4JError

    from cqrs.spark_session import stop_between_batches

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while query.isActive and not stop.is_set():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    try:
        error = query.exception()
        if error is None and query.isActive:
            say("stopping after the running micro-batch")
            stop_between_batches([(query, drain)])
        else:
            query.stop()
    except Py4JError:  # the JVM is gone: it was signalled too, e.g. with the process group
        say("stopped: the Spark JVM ended before its query (send SIGTERM to this process only "
            "to let the running micro-batch finish)")
        return 0
    if error is not None:
        say(f"stopped: {error}")
        return 1
    return 0


def job_parsers(commands: argparse._SubParsersAction) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    """The ``cqrs run`` group, for other command modules to add their job (``run projector``)."""
    return getattr(commands.choices["run"], _JOBS)  # type: ignore[no-any-return]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = commands.add_parser("run", help="run a streaming job of an app")
    sub = run.add_subparsers(dest="job", required=True, metavar="JOB")
    setattr(run, _JOBS, sub)
    processor = sub.add_parser("processor", help="the command processor: commands -> events and results")
    processor.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    processor.add_argument("--checkpoint", help="checkpoint folder (default: <checkpoint_dir>/<topic prefix><app>/processor)")
    processor.add_argument("--max-offsets-per-trigger", type=int, default=None,
                           help="cap on commands read per micro-batch (default: all available)")
    processor.add_argument("--trigger", default=None, metavar="INTERVAL",
                           help="micro-batch interval, e.g. '1 second' (default: back to back)")
    processor.add_argument("--available-now", action="store_true",
                           help="process what is in the topic now, then exit")
    processor.set_defaults(run=_run_processor)


def _run_processor(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.processor.job import checkpoint_for, start_processor
    from cqrs.processor.workers import ProcessorOptions
    from cqrs.processor.partition import SliceStats
    from cqrs.processor.source import new_stop_file
    from cqrs.spark_session import spark_session

    app = load_app(args.app)
    opts = ProcessorOptions(
        app_ref=args.app,
        checkpoint=args.checkpoint or checkpoint_for(cfg, app.name),
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        trigger_interval=args.trigger,
    )
    spark = spark_session(cfg, f"cqrs-processor-{app.name}")
    started = [time.monotonic()]

    def on_batch(batch_id: int, s: SliceStats) -> None:
        if not s.commands and not args.available_now:
            return  # serving continuously, a quiet stream's batches come every few seconds
        now = time.monotonic()
        rate = s.commands / max(now - started[0], 1e-6)
        started[0] = now
        print(f"batch {batch_id}: {s.commands} commands ({s.accepted} accepted, {s.rejected} "
              f"rejected, {s.failed} failed), {s.aggregates} aggregates, {s.events} events, "
              f"{s.dead_letters} dead letters, {s.skipped} already applied, "
              f"{rate:,.0f} commands/s", flush=True)

    stop_file = new_stop_file()
    query = start_processor(spark, cfg, opts, available_now=args.available_now, on_batch=on_batch,
                            continuous=True,  # the processor has this driver to itself
                            stop_file=stop_file)
    print(f"processor for {app.name!r} running; checkpoint {opts.checkpoint}", flush=True)
    return serve_query(query, drain=Path(stop_file).touch)
