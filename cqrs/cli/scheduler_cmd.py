"""``cqrs run scheduler <module:app>``: the deadline timer of an app alone, and ``cqrs deadlines
list``: an aggregate's pending deadlines."""

from __future__ import annotations

import argparse
import json
from typing import Any

from cqrs.cli.run_cmd import job_parsers, say, serve_query
from cqrs.config import CqrsConfig

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = job_parsers(commands).add_parser(
        "scheduler", help="the deadline timer: commands handlers scheduled, sent when due",
        description="Reads the app's due deadlines from Cassandra every [scheduler] interval_s "
        "(a slice of one due-time bucket, never a scan) and sends each one's command to the "
        "commands topic (id dl:<owner>:<name>:<due ms>: a second firing is answered with the "
        "first result). Also part of `cqrs run app`. Settings: [scheduler].")
    run.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.orders:app)")
    run.set_defaults(run=_run)

    dl = commands.add_parser("deadlines", help="pending deadlines")
    sub = dl.add_subparsers(dest="action", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="the deadlines an aggregate scheduled that have not fired",
                        description="Prints one line per deadline (due time, name, the command "
                        "and where it goes), earliest first; --json for JSON.")
    ls.add_argument("app", help="the App, as module:attribute")
    ls.add_argument("aggregate_id", help="the aggregate that scheduled them")
    ls.add_argument("--type", dest="aggregate_type", default=None,
                    help="aggregate type name (default: every aggregate type of the app)")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(run=_list)


def _run(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.scheduler.job import SchedulerOptions, start_scheduler

    app = load_app(args.app)

    def on_round(s: Any) -> None:
        say(f"fired {s.fired}, dropped {s.stale} cancelled or moved"
            + (f", lateness max {max(s.lateness_s):.3f} s" if s.lateness_s else ""))

    query = start_scheduler(cfg, SchedulerOptions(args.app), on_round=on_round)
    say(f"scheduler of {app.name!r} running (a round every {cfg.scheduler.interval_s:g} s)")
    return serve_query(query)


def _list(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.scheduler.records import deadline_json
    from cqrs.scheduler.store import pending_deadlines

    app = load_app(args.app)
    found = pending_deadlines(cfg, app, args.aggregate_id, args.aggregate_type)
    if args.json:
        print(json.dumps([deadline_json(d) for d in found], indent=2))
        return 0
    if not found:
        print(f"no pending deadline of {args.aggregate_id!r}")
    for d in found:
        j = deadline_json(d)
        print(f"{j['due']}  {j['name']}  -> {j['command_type']} to {j['target_type']} "
              f"{j['target_id']!r}  ({j['command_id']})")
    return 0
