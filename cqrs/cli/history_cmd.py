"""``cqrs history APP ID``: an aggregate's events from the history table, and ``cqrs run history
APP``: the job that keeps that table."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cqrs.cli.run_cmd import job_parsers, say, serve_query
from cqrs.config import CqrsConfig

__all__ = ["history_table", "register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    history = commands.add_parser(
        "history", help="an aggregate's events in version order, with their envelopes",
        description="Reads the history table in Cassandra (no Spark), which the history job "
        "keeps (`cqrs run history APP`, or part of `cqrs run app`). Events written by an older "
        "class show in their current shape (the app's upcasters). `time` is the domain time "
        "(the command's), `recorded` the time Kafka recorded the event. The table cuts a cell "
        "longer than 60 characters with '…' (the data, mostly): --json prints every event "
        "whole. Run it with the topic prefix of the history job (CQRS_KAFKA_TOPIC_PREFIX): the "
        "rows are kept per prefix and app, and another prefix finds none.")
    history.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    history.add_argument("aggregate_id", help="the aggregate id")
    history.add_argument("--type", dest="aggregate_type", default=None,
                         help="aggregate type name, needed when the id exists under several types")
    history.add_argument("--from-version", type=int, default=1,
                         help="the first version to show (default 1)")
    history.add_argument("--limit", type=int, default=100,
                         help="events to show at most (default 100; the next page's "
                         "--from-version is printed when there are more)")
    history.add_argument("--json", action="store_true",
                         help="one JSON object: the events whole (envelope and data, nothing "
                         "cut) and next_version, the next page's --from-version (null on the "
                         "last page; over HTTP the same number is next_page_token, as text)")
    history.set_defaults(run=_run_history)

    run = job_parsers(commands).add_parser(
        "history", help="the history job: events -> the history table (an aggregate's events, "
        "state at a version or time)",
        description="Serves the app's events topic (no Spark) and writes one row per event into "
        "the Cassandra table cqrs_history, keyed by aggregate and version (writing twice writes "
        "the same row), then commits its offsets to Kafka under the group "
        "cqrs-history-<topic prefix><app>. Also part of `cqrs run app`.")
    run.add_argument("app", help="the App, as module:attribute")
    run.add_argument("--replay", action="store_true",
                     help="write the whole event log again, from its start (rebuilds the table)")
    run.add_argument("--max-events-per-chunk", type=int, default=10_000, dest="max_events",
                     help="cap on event records written at once (default: 10000)")
    run.add_argument("--available-now", action="store_true",
                     help="write what is in the topic now, then exit")
    run.set_defaults(run=_run_job)


def history_table(events: Any) -> str:
    """The events as a text table: version, type, the two clocks (domain time and the time Kafka
    recorded it), command and correlation ids (the latter when not the command's), the data."""
    from cqrs.cli.tables import render_table
    from cqrs.client.json_commands import to_jsonable

    rows = [(e.version, e.event_type, e.timestamp.isoformat(timespec="milliseconds"),
             e.recorded_at.isoformat(timespec="milliseconds"), e.command_id,
             None if e.correlation_id == e.command_id else e.correlation_id,
             json.dumps(to_jsonable(e.event), sort_keys=True)) for e in events]
    return render_table(["version", "type", "time", "recorded", "command", "correlation", "data"],
                        rows, max_width=60, right=["version"])


def _run_history(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.history import HistoryReader
    from cqrs.history.forms import event_json
    from cqrs.loading import load_app

    app = load_app(args.app)
    with HistoryReader(app, cfg) as history:
        page = history.events(args.aggregate_id, args.aggregate_type,
                              from_version=args.from_version, limit=args.limit)
        # an empty page past the end of a history that exists is not "no history"
        past_the_end = not page.events and not args.json and args.from_version > 1 and bool(
            history.events(args.aggregate_id, args.aggregate_type, limit=1).events)
    if args.json:
        print(json.dumps({"events": [event_json(e) for e in page.events],
                          "next_version": page.next_version}, indent=2))
        return 0 if page.events or args.from_version > 1 else 1
    if not page.events:
        if past_the_end:
            print(f"aggregate {args.aggregate_id!r} of app {app.name!r} has no events from "
                  f"version {args.from_version} on: its history ends before it (ask for a lower "
                  "--from-version)", file=sys.stderr)
        else:
            print(f"no history for aggregate {args.aggregate_id!r} of app {app.name!r} under "
                  f"topic prefix {cfg.kafka.topic_prefix!r} (is the history job running: "
                  "`cqrs run history`? is CQRS_KAFKA_TOPIC_PREFIX the processor's?)",
                  file=sys.stderr)
        return 1
    print(history_table(page.events))
    if page.next_version is not None:
        print(f"... more: --from-version {page.next_version}")
    return 0


def _run_job(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from collections.abc import Mapping

    from cqrs.history.job import HistoryOptions, group_id_for, start_history
    from cqrs.loading import load_app
    from cqrs.topics import topics_for

    app = load_app(args.app)
    opts = HistoryOptions(app_ref=args.app, replay=args.replay,
                          max_events_per_chunk=args.max_events)

    def on_progress(_: str, p: Mapping[str, Any]) -> None:
        if p["numInputRows"]:
            say(f"{p['numInputRows']} records: {p['historyRows']} history rows written")

    if args.replay:
        say("replaying the event log from its start")
    query = start_history(cfg, opts, available_now=args.available_now, on_progress=on_progress)
    say(f"history of {app.name!r} serving; offsets in consumer group "
        f"{group_id_for(topics_for(app.name, cfg.kafka.topic_prefix))}")
    return serve_query(query)
