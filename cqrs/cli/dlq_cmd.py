"""``cqrs dlq list|show|retry|park|purge``: the command processor's dead letters, as the retry
job (``cqrs run retrier``) records them: what still waits, each letter's history, and the
operator's actions. ``list --raw`` reads the dead-letters topic itself (no retry job needed)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
from typing import Any

import attrs

from cqrs.cli.tables import render_table
from cqrs.config import CqrsConfig
from cqrs.topics import AppTopics, topics_for

__all__ = ["register"]

_POSITION = re.compile(r"^\d+:\d+$")
_APP_HELP = "the App, as module:attribute (e.g. domain_examples.bank:app)"


def _filters(p: argparse.ArgumentParser, state_default: str) -> None:
    p.add_argument("--state", default=state_default,
                   choices=["waiting", "parked", "done", "open", "all"],
                   help=f"letters in this state (open: waiting or parked; default {state_default})")
    p.add_argument("--command-type", help="only letters of this command type (e.g. bank.Deposit)")
    p.add_argument("--error-type", help="only letters that failed with this error type")
    p.add_argument("--older-than", metavar="AGE",
                   help="only letters whose first failure is older, e.g. 30s, 15m, 2h, 1d")


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dlq = commands.add_parser("dlq", help="the command processor's dead letters: list, show, "
                              "retry, park, purge")
    sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    ls = sub.add_parser("list", help="letters still waiting or parked (oldest first), with counts",
                        description="Letters as the retry job recorded them; done ones (retried, "
                        "answered) are not shown unless asked (--state done|all).")
    ls.add_argument("app", help=_APP_HELP)
    _filters(ls, "open")
    ls.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")
    ls.add_argument("--raw", action="store_true",
                    help="read the dead-letters topic itself (every letter, filters ignored)")
    ls.set_defaults(run=_list)
    show = sub.add_parser("show", help="a letter's history: each attempt and the outcome of its retry")
    show.add_argument("app", help=_APP_HELP)
    show.add_argument("command_id", metavar="COMMAND_ID")
    show.add_argument("--json", action="store_true", help="JSON instead of text")
    show.set_defaults(run=_show)
    retry = sub.add_parser(
        "retry", help="retry letters now (command ids) or send dead letters again (positions)",
        description="A COMMAND_ID that is waiting becomes due now (the retry job sends it, same "
        "id); one that is parked is sent again under a derived id, as is a dead letter named by "
        "PARTITION:OFFSET (`list --raw`): <command id>~retry@<partition>:<offset>, so retrying "
        "the same letter twice runs it once. Fix the cause first: a deterministic handler fails "
        "the same way.")
    retry.add_argument("app", help=_APP_HELP)
    retry.add_argument("positions", nargs="*", metavar="COMMAND_ID|PARTITION:OFFSET",
                       help="letters to retry, as shown by `cqrs dlq list` (or --raw)")
    retry.add_argument("--all", action="store_true",
                       help="send every dead letter of the topic again (derived ids)")
    retry.set_defaults(run=_retry)
    park = sub.add_parser("park", help="stop retrying waiting letters (copied to <app>.dead-letters.parked)")
    park.add_argument("app", help=_APP_HELP)
    park.add_argument("command_ids", nargs="+", metavar="COMMAND_ID")
    park.set_defaults(run=_park)
    purge = sub.add_parser("purge", help="forget letters: by command id, or all that match the filters",
                           description="Deletes letters' rows and histories from the retry "
                           "tables (the dead-letters topic keeps its records).")
    purge.add_argument("app", help=_APP_HELP)
    purge.add_argument("command_ids", nargs="*", metavar="COMMAND_ID")
    _filters(purge, "done")
    purge.set_defaults(run=_purge)


def _app_topics(cfg: CqrsConfig, app_ref: str) -> tuple[Any, AppTopics]:
    from cqrs.loading import load_app

    app = load_app(app_ref)
    return app, topics_for(app.name, cfg.kafka.topic_prefix)


def _store(cfg: CqrsConfig, topics: AppTopics) -> Any:
    from cqrs.retrier.store import RetryStore

    return RetryStore(cfg, topics.base)


def _filter(args: argparse.Namespace) -> Any:
    from cqrs.retrier.plan import LetterFilter, parse_age

    return LetterFilter(state=None if args.state == "all" else args.state,
                        command_type=args.command_type, error_type=args.error_type,
                        older_than_s=parse_age(args.older_than) if args.older_than else None)


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _list(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    if args.raw:
        return _list_raw(cfg, args)
    from cqrs.retrier.operators import list_letters

    _, topics = _app_topics(cfg, args.app)
    store = _store(cfg, topics)
    try:
        listing = list_letters(store, _filter(args))
    finally:
        store.close()
    if args.json:
        for row in listing.letters:
            print(json.dumps(attrs.asdict(row), sort_keys=True))
        return 0
    counts = ", ".join(f"{n} {s}" for s, n in listing.counts.items())
    if listing.letters:
        print(render_table(
            ["command id", "state", "attempts", "command type", "error", "aggregate",
             "first failure", "next retry"],
            [(r.command_id, r.state, r.attempts, r.command_type, f"{r.error_type}: {r.error}",
              r.aggregate_id, _when(r.first_ms or r.last_ms),
              _when(r.due_ms) if r.state == "waiting" else "") for r in listing.letters],
            max_width=40))
        print()
    print(f"{len(listing.letters)} letter(s) shown; all letters of {topics.base}: {counts}. "
          "History: `cqrs dlq show APP COMMAND_ID`")
    if not sum(listing.counts.values()):
        print("(letters are recorded by the retry job, `cqrs run retrier APP` or `cqrs run app "
              "APP`; `cqrs dlq list APP --raw` reads the dead-letters topic itself)")
    return 0


def _list_raw(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.deadletters import list_dead_letters

    _, topics = _app_topics(cfg, args.app)
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


def _show(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.retrier.operators import letter_history

    app, topics = _app_topics(cfg, args.app)
    store = _store(cfg, topics)
    try:
        data = letter_history(cfg, app, topics, store, args.command_id)
    finally:
        store.close()
    if args.json:
        print(json.dumps(data, sort_keys=True, indent=2))
        return 0
    print(f"{data['command_id']}: {data['state']}, {data['attempts']} failed attempt(s), "
          f"{data['command_type']} on {data['aggregate_id']}")
    print(render_table(
        ["attempt", "failed at", "stage", "error", "letter", "retry", "retry outcome"],
        [(h["attempt"], _when(h["failed_at_ms"]), h["stage"], f"{h['error_type']}: {h['error']}",
          h["letter"], h["state"] + (f" as {h['retry_command_id']}" if h["retry_command_id"] else ""),
          h["retry_outcome"] or "") for h in data["history"]], max_width=40))
    return 0


def _retry(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.errors import ConfigError

    if bool(args.positions) == bool(args.all):
        raise ConfigError("name the letters to retry (COMMAND_ID or PARTITION:OFFSET ...) or pass "
                          "--all, not both")
    _, topics = _app_topics(cfg, args.app)
    positions = [p for p in args.positions if _POSITION.match(p)]
    ids = [p for p in args.positions if not _POSITION.match(p)]
    if args.all or positions:
        _retry_positions(cfg, topics, None if args.all else positions)
    if ids:
        from cqrs.retrier.operators import retry_letters

        store = _store(cfg, topics)
        try:
            for line in retry_letters(cfg, topics, store, ids):
                print(line)
        finally:
            store.close()
    return 0


def _retry_positions(cfg: CqrsConfig, topics: AppTopics, positions: list[str] | None) -> None:
    from cqrs.deadletters import list_dead_letters, retry_dead_letters
    from cqrs.retrier.operators import record_manual_retry

    letters = list_dead_letters(cfg, topics)
    ids = retry_dead_letters(cfg, topics, letters, positions)
    by_position = {d.position: d for d in letters}
    chosen = list(letters) if positions is None else [by_position[p] for p in positions]
    store = None
    try:
        from cqrs.retrier.store import RetryStoreError

        store = _store(cfg, topics)
        for dead, new_id in zip(chosen, ids, strict=True):
            if dead.command_id and store.attempt(dead.command_id, dead.attempt) is not None:
                record_manual_retry(store, dead.command_id, dead.attempt, new_id, cfg, topics)
    except RetryStoreError as exc:  # the letters are sent; only their history is not updated
        print(f"(history not updated: {exc})")
    finally:
        if store is not None:
            store.close()
    for new_id in ids:
        print(f"sent {new_id}")
    print(f"{len(ids)} command(s) sent to {topics.commands}; their results arrive under these "
          "ids (`cqrs dlq show APP COMMAND_ID` shows them)")


def _park(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.retrier.operators import park_letters

    _, topics = _app_topics(cfg, args.app)
    store = _store(cfg, topics)
    try:
        for line in park_letters(cfg, topics, store, args.command_ids):
            print(line)
    finally:
        store.close()
    return 0


def _purge(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.retrier.operators import list_letters, purge_letters

    _, topics = _app_topics(cfg, args.app)
    store = _store(cfg, topics)
    try:
        ids = args.command_ids or [r.command_id for r in list_letters(store, _filter(args)).letters]
        n = purge_letters(store, ids)
    finally:
        store.close()
    print(f"{n} letter(s) purged from the retry tables of {topics.base}")
    return 0
