"""``cqrs dlq list|retry``: the command processor's dead letters."""

from __future__ import annotations

import argparse
import json

import attrs

from cqrs.cli.tables import render_table
from cqrs.config import CqrsConfig
from cqrs.topics import AppTopics, topics_for

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dlq = commands.add_parser("dlq", help="list and retry the command processor's dead letters")
    sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="print the app's dead letters (oldest first)")
    ls.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    ls.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    ls.set_defaults(run=_list)
    retry = sub.add_parser(
        "retry", help="send dead-lettered commands again under derived command ids",
        description="Sends each chosen dead letter's original command to the commands topic "
        "again, as <command id>~retry@<partition>:<offset>; retrying the same dead letter "
        "twice runs it once. Fix the cause first: a deterministic handler fails the same way.")
    retry.add_argument("app", help="the App, as module:attribute")
    retry.add_argument("positions", nargs="*", metavar="PARTITION:OFFSET",
                       help="dead letters to retry, as shown by `cqrs dlq list`")
    retry.add_argument("--all", action="store_true", help="retry every dead letter")
    retry.set_defaults(run=_retry)


def _topics(cfg: CqrsConfig, app_ref: str) -> AppTopics:
    from cqrs.loading import load_app

    return topics_for(load_app(app_ref).name, cfg.kafka.topic_prefix)


def _list(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.deadletters import list_dead_letters

    topics = _topics(cfg, args.app)
    letters = list_dead_letters(cfg, topics)
    if args.json:
        for d in letters:
            data = attrs.asdict(d, filter=lambda a, _: a.name not in ("key", "value", "headers"))
            data.update(command_id=d.command_id, aggregate_id=d.aggregate_id,
                        message_type=d.message_type)
            print(json.dumps(data, sort_keys=True))
        return 0
    if not letters:
        print(f"no dead letters in {topics.dead_letters}")
        return 0
    print(render_table(
        ["position", "stage", "error", "aggregate", "command type", "command id", "from"],
        [(d.position, d.stage, f"{d.error_type}: {d.error}", d.aggregate_id, d.message_type,
          d.command_id, f"{d.source_partition}:{d.source_offset}") for d in letters],
        max_width=48))
    print(f"\n{len(letters)} dead letter(s) in {topics.dead_letters}; "
          "retry with `cqrs dlq retry APP PARTITION:OFFSET ...` once the cause is fixed")
    return 0


def _retry(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.deadletters import list_dead_letters, retry_dead_letters
    from cqrs.errors import ConfigError

    if bool(args.positions) == bool(args.all):
        raise ConfigError("name the dead letters to retry (PARTITION:OFFSET ...) or pass --all, not both")
    topics = _topics(cfg, args.app)
    letters = list_dead_letters(cfg, topics)
    ids = retry_dead_letters(cfg, topics, letters, None if args.all else args.positions)
    for new_id in ids:
        print(f"sent {new_id}")
    print(f"{len(ids)} command(s) sent to {topics.commands}; their results arrive under these ids")
    return 0
