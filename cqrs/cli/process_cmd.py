"""``cqrs run process-manager <module:app> <name>``: one process manager of an app, and
``cqrs conversation wait``: wait for the end of a conversation."""

from __future__ import annotations

import argparse

from cqrs.cli.run_cmd import job_parsers, say, serve_query
from cqrs.config import CqrsConfig

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = job_parsers(commands).add_parser(
        "process-manager", help="a process manager: events -> commands across aggregates",
        description="Reads the app's events topic from its checkpoint, runs the process "
        "manager's reactions and sends their commands (derived ids: sending twice applies "
        "once). Stateful process managers keep their instances in Cassandra.")
    run.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.lending:app)")
    run.add_argument("name", help="the process manager's name (ProcessManager.name)")
    run.add_argument("--checkpoint",
                     help="checkpoint folder (default: <checkpoint_dir>/<app>/process-managers/<name>)")
    run.add_argument("--replay", action="store_true",
                     help="forget the checkpoint and react to the whole event log again (commands "
                     "already applied are recognised by the processor and change nothing)")
    run.add_argument("--max-events-per-trigger", type=int, default=10_000,
                     help="cap on events read per micro-batch (default: 10000)")
    run.add_argument("--available-now", action="store_true",
                     help="react to what is in the topic now, then exit")
    run.set_defaults(run=_run)

    conv = commands.add_parser("conversation", help="conversations between aggregates")
    sub = conv.add_subparsers(dest="action", required=True, metavar="ACTION")
    wait = sub.add_parser("wait", help="wait for the event that ends a conversation",
                          description="Prints the outcome a process manager recorded for the "
                          "correlation id (by default the id of the command that started it).")
    wait.add_argument("app", help="the App, as module:attribute")
    wait.add_argument("correlation_id")
    wait.add_argument("--timeout", type=float, default=30.0, help="seconds (default: 30)")
    wait.add_argument("--since", type=float, default=3600.0,
                      help="look back this many seconds for an outcome already written (default: 3600)")
    wait.set_defaults(run=_wait)


def _run(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    from cqrs.loading import load_app
    from cqrs.process.job import ProcessManagerOptions, checkpoint_for, start_process_manager
    from cqrs.process.reactor import process_manager_of
    from cqrs.spark_session import spark_session

    app = load_app(args.app)
    process_manager_of(app, args.name)  # a clear error before Spark starts
    checkpoint = args.checkpoint or checkpoint_for(cfg, app.name, args.name)
    if args.replay:
        if "://" in checkpoint and not checkpoint.startswith("file:"):
            raise SystemExit(f"--replay removes local checkpoints only; remove {checkpoint} yourself")
        shutil.rmtree(Path(checkpoint.removeprefix("file:")), ignore_errors=True)
        say(f"replaying the event log from the start (checkpoint {checkpoint} removed)")
    opts = ProcessManagerOptions(app_ref=args.app, name=args.name, checkpoint=checkpoint,
                                 max_events_per_trigger=args.max_events_per_trigger)
    spark = spark_session(cfg, f"cqrs-process-manager-{app.name}-{args.name}")

    def on_batch(batch_id: int, r: object) -> None:
        if getattr(r, "events", 0):
            say(f"batch {batch_id}: {r}")

    query = start_process_manager(spark, cfg, opts, available_now=args.available_now,
                                  on_batch=on_batch)
    say(f"process manager {args.name!r} of {app.name!r} running; checkpoint {checkpoint}")
    return serve_query(query)


def _wait(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.client.conversations import wait_for_outcome
    from cqrs.loading import load_app

    app = load_app(args.app)
    outcome, event = wait_for_outcome(cfg, app, args.correlation_id, timeout=args.timeout,
                                      since_s=args.since)
    print(f"{outcome.correlation_id}: {outcome.event_type} of {outcome.aggregate_type} "
          f"{outcome.aggregate_id} v{outcome.version} at {outcome.timestamp.isoformat()} "
          f"(process manager {outcome.process_manager})")
    print(f"  {event!r}")
    return 0
