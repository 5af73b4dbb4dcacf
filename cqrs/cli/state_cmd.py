"""``cqrs state get`` and ``cqrs rebuild-state``: read and rebuild the processor's aggregate state."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import attrs

from cqrs.config import CqrsConfig

__all__ = ["register", "state_as_json"]


class _DeprecatedWait(argparse.Action):
    """``--version N``: stored as ``--wait-for-version N``, and remembered, for the note."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.deprecated_wait = True


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    state = commands.add_parser("state", help="read the command processor's aggregate state")
    sub = state.add_subparsers(dest="state_command", required=True, metavar="ACTION")
    get = sub.add_parser("get", help="print one aggregate's version and state as JSON: now (the "
                         "state table), or as it was at a version or a time (the history table)")
    get.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    get.add_argument("aggregate_id", help="the aggregate id (the commands' Kafka key)")
    get.add_argument("--type", dest="aggregate_type", default=None,
                     help="aggregate type name, needed when the id exists under several types")
    get.add_argument("--wait-for-version", type=int, default=None, dest="min_version",
                     metavar="N",
                     help="wait until the aggregate is at version N or later, then print its "
                     "current state (read-your-writes)")
    get.add_argument("--version", type=int, default=None, dest="min_version",
                     metavar="N", action=_DeprecatedWait,
                     help="deprecated spelling of --wait-for-version (it never meant the state "
                     "at version N: that is --at-version N)")
    get.add_argument("--timeout", type=float, default=10.0,
                     help="seconds to wait for --wait-for-version (default 10)")
    past = get.add_mutually_exclusive_group()
    past.add_argument("--at-version", type=int, default=None, metavar="N",
                      help="the state as it was at version N (folded from the history table)")
    past.add_argument("--at", default=None, metavar="TIME",
                      help="the state as it was at TIME (ISO-8601 with a UTC offset, e.g. "
                      "2026-03-01T12:00:00+00:00): after the last event recorded by then")
    get.set_defaults(run=_run_get, deprecated_wait=False)

    rebuild = commands.add_parser(
        "rebuild-state",
        help="rebuild the processor's aggregate state from the events topic into a new generation",
        description="Stop the app's processor first. Folds the events topic (and the results "
        "topic, for de-duplication and the commands' starting offsets) into a new generation of "
        "the aggregate-state table, processes what was not answered yet on a fresh checkpoint "
        "and makes the new generation current; then run `cqrs run processor APP --checkpoint NEW`.",
    )
    rebuild.add_argument("app", help="the App, as module:attribute")
    rebuild.add_argument("--checkpoint", help="the NEW checkpoint folder to build (default: the "
                         "processor's default checkpoint, which must not exist)")
    rebuild.add_argument("--generation", type=int, default=None,
                         help="the state generation to build (default: the current one plus one)")
    rebuild.set_defaults(run=_run_rebuild)


def state_as_json(state: Any) -> str:
    """An :class:`~cqrs.processor.state.AggregateState` as indented JSON, each value written as
    ``GET /aggregates/{id}`` writes it (enum names, ISO-8601 times, base64 bytes)."""
    from cqrs.client.json_commands import to_jsonable

    return json.dumps(to_jsonable(state), indent=2, sort_keys=True)


def _run_get(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.processor.state import StateReader

    app = load_app(args.app)
    if args.deprecated_wait:
        print("cqrs: note: --version is deprecated, use --wait-for-version (it waits for a "
              "version and prints the current state; --at-version N prints the state at N)",
              file=sys.stderr)
    if args.at_version is not None or args.at is not None:
        return _run_get_past(cfg, app, args)
    with StateReader(app, cfg) as states:
        state = states.get(args.aggregate_id, args.aggregate_type, min_version=args.min_version,
                           timeout=args.timeout)
    if state is None:
        print(f"no state for aggregate {args.aggregate_id!r} of app {app.name!r}", file=sys.stderr)
        return 1
    print(state_as_json(state))
    return 0


def _run_get_past(cfg: CqrsConfig, app: Any, args: argparse.Namespace) -> int:
    from cqrs.history import HistoryReader
    from cqrs.history.forms import parse_time

    if args.min_version is not None:
        print("cqrs: error: --wait-for-version reads the current state; it does not go with "
              "--at-version / --at", file=sys.stderr)
        return 2
    at = None if args.at is None else parse_time(args.at)
    with HistoryReader(app, cfg) as history:
        state = history.state_at(args.aggregate_id, args.aggregate_type,
                                 version=args.at_version, at=at)
    if state is None:
        print(f"no history for aggregate {args.aggregate_id!r} of app {app.name!r} (is the "
              "history job running: `cqrs run history`?)", file=sys.stderr)
        return 1
    print(state_as_json(state))
    return 0


def _run_rebuild(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.processor.workers import ProcessorOptions
    from cqrs.processor.rebuild import default_rebuild_checkpoint, rebuild_state
    from cqrs.spark_session import spark_session

    app = load_app(args.app)
    checkpoint = args.checkpoint or default_rebuild_checkpoint(cfg, app.name)
    opts = ProcessorOptions(app_ref=args.app, checkpoint=checkpoint)
    spark = spark_session(cfg, f"cqrs-rebuild-{app.name}")
    report = rebuild_state(spark, cfg, opts, checkpoint, generation=args.generation,
                           progress=lambda msg: print(msg, flush=True))
    print(json.dumps(attrs.asdict(report), indent=2, default=str))
    print(f"next: cqrs run processor {args.app} --checkpoint {checkpoint}")
    return 0
