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
        description="Serves the app's events topic (no Spark): each event of the process "
        "manager's types is reacted to within milliseconds of its write, its commands sent "
        "(derived ids: sending twice applies once), its instances written (stateful process "
        "managers keep them in Cassandra), then its offsets committed to Kafka under the group "
        "cqrs-pm-<topic prefix><app>-<name>. A restart goes on from the committed offsets.")
    run.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.lending:app)")
    run.add_argument("name", help="the process manager's name (ProcessManager.name)")
    run.add_argument("--checkpoint",
                     help="the Spark checkpoint an earlier release kept (default: <checkpoint_dir>/"
                     "<app>/process-managers/<name>): a first start goes on from its offsets")
    run.add_argument("--replay", action="store_true",
                     help="react to the whole event log again, from its start (commands already "
                     "applied are recognised by the processor and change nothing)")
    run.add_argument("--max-events-per-chunk", "--max-events-per-trigger", type=int,
                     default=10_000, dest="max_events",
                     help="cap on event records reacted to at once (default: 10000)")
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
    from collections.abc import Mapping
    from typing import Any

    from cqrs.loading import load_app
    from cqrs.process.job import ProcessManagerOptions, group_id_for, start_process_manager
    from cqrs.process.reactor import process_manager_of
    from cqrs.topics import topics_for

    app = load_app(args.app)
    process_manager_of(app, args.name)  # a clear error before anything starts
    opts = ProcessManagerOptions(app_ref=args.app, name=args.name, checkpoint=args.checkpoint,
                                 max_events_per_chunk=args.max_events, replay=args.replay)

    def on_progress(_: str, p: Mapping[str, Any]) -> None:
        if p["numInputRows"]:
            say(f"{p['numInputRows']} events: reacted={p['reactions']} commands={p['commands']} "
                f"outcomes={p['outcomes']} failures={p['failures']}")

    group = group_id_for(topics_for(app.name, cfg.kafka.topic_prefix), args.name)
    if args.replay:
        say("replaying the event log from its start")
    query = start_process_manager(cfg, opts, available_now=args.available_now,
                                  on_progress=on_progress)
    say(f"process manager {args.name!r} of {app.name!r} serving; offsets in consumer group {group}")
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
