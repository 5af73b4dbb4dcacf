"""The read side's commands: ``cqrs run projector``, ``cqrs projections status|dlq`` and
``cqrs rebuild``. The CLI is the one layer that sees both ``cqrs`` and ``projections``."""

from __future__ import annotations

import argparse
import collections
import json
from typing import Any

from cqrs.cli.run_cmd import job_parsers
from cqrs.config import CqrsConfig

__all__ = ["register"]

_APP_HELP = "the App, as module:attribute (e.g. domain_examples.bank:app)"


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    projector = job_parsers(commands).add_parser(
        "projector", help="the projectors: events -> read models (one query per projection)")
    projector.add_argument("app", help=_APP_HELP)
    projector.add_argument("projections", nargs="*", help="projection names (default: all)")
    projector.add_argument("--trigger", default=None, metavar="INTERVAL",
                           help="micro-batch interval, e.g. '1 second' (default: back to back)")
    projector.add_argument("--available-now", action="store_true",
                           help="apply what is in the events topic now, then exit")
    projector.set_defaults(run=_run_projector)

    group = commands.add_parser("projections", help="inspect projections and their dead letters")
    sub = group.add_subparsers(dest="projections_command", required=True, metavar="ACTION")
    status = sub.add_parser("status", help="generation, position per partition and lag of each projection")
    status.add_argument("app", help=_APP_HELP)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(run=_run_status)
    dlq = sub.add_parser(
        "dlq", help="list or replay the projections' dead letters",
        description="list: the dead letters in the topic, then the parked views the projector "
        "retries (waiting, with the next attempt's due time) or gave up on (parked for an "
        "operator), each with its attempts. replay: fold the dead letters with today's "
        "handlers and release the views whose events all apply.")
    dlq.add_argument("app", help=_APP_HELP)
    dlq.add_argument("action", choices=["list", "replay"])
    dlq.add_argument("--projection", default=None, help="only this projection")
    dlq.add_argument("--json", action="store_true", help="list: print JSON")
    dlq.set_defaults(run=_run_dlq)

    rebuild = commands.add_parser(
        "rebuild", help="rebuild a projection from the event log into a new generation",
        description="Replays the events topic into new tables while readers use the current "
        "ones, then switches readers atomically and drops the old tables. Refused before it "
        "starts when the app's classes cannot read the stored schemas; when events were "
        "dead-lettered into the new tables it does not switch (readers stay, nothing is "
        "dropped) and exits 2, unless --allow-dead-letters.")
    rebuild.add_argument("app", help=_APP_HELP)
    rebuild.add_argument("projection", help="the projection's name")
    rebuild.add_argument("--keep-old", action="store_true", help="do not drop the old generation")
    rebuild.add_argument("--force", action="store_true",
                         help="start over although a rebuild is recorded as under way")
    rebuild.add_argument("--allow-dead-letters", action="store_true",
                         help="switch readers to the new generation (and drop the old one) even "
                         "if events were dead-lettered while it was built")
    rebuild.set_defaults(run=_run_rebuild)


def _run_projector(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.spark_session import spark_session
    from projections.runner import run_projectors

    spark = spark_session(cfg, f"cqrs-projector-{args.app}")
    try:
        run_projectors(spark, cfg, args.app, args.projections, available_now=args.available_now,
                       trigger_interval=args.trigger, report=lambda m: print(m, flush=True))
    except KeyboardInterrupt:
        pass
    return 0


def _run_status(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    import attrs

    from cqrs.loading import load_app
    from cqrs.topics import topics_for
    from projections.positions import projection_status
    from projections.stores import open_store

    app = load_app(args.app)
    store = open_store(cfg)
    try:
        found = projection_status(cfg, app, store, topics_for(app.name, cfg.kafka.topic_prefix).events)
    finally:
        store.close()
    if args.json:
        print(json.dumps([{**attrs.asdict(s), "lag": s.lag} for s in found], indent=2))
        return 0
    for s in found:
        gen = "never run" if s.current is None else f"generation {s.current}"
        building = f", rebuilding into {s.building}" if s.building is not None else ""
        print(f"{s.name}: {gen}{building}, lag {s.lag:,} events")
        for p in s.partitions:
            print(f"  partition {p.partition}: position {p.position:,} of {p.end:,} (lag {p.lag:,})")
    return 0


def _run_dlq(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore
    from cqrs.loading import load_app
    from cqrs.personal.stack import key_store_for
    from cqrs.topics import topics_for
    from projections.apply import Target
    from projections.dlq import dead_letter_topic, read_dead_letters, replay_dead_letters
    from projections.model import select
    from projections.personal import with_personal_columns
    from projections.store import table_base
    from projections.stores import open_store

    app = load_app(args.app)
    entries = read_dead_letters(cfg, dead_letter_topic(app.name, cfg.kafka.topic_prefix))
    wanted = {p.name for p in select(app, [args.projection] if args.projection else [])}
    by_projection = collections.defaultdict(list)
    for e in entries:
        if e.projection in wanted:
            by_projection[e.projection].append(e.letter)
    if args.action == "list":
        parkings = _parkings(cfg, app, sorted(wanted))
        if args.json:
            print(json.dumps({
                "dead_letters": [{"projection": name, "aggregate_id": dl.record.aggregate_id,
                                  "version": dl.record.version,
                                  "message_type": dl.record.message_type, "reason": dl.reason,
                                  "error": dl.error}
                                 for name, letters in sorted(by_projection.items())
                                 for dl in letters],
                "parkings": parkings}, indent=2))
            return 0
        for name, letters in sorted(by_projection.items()):
            for dl in letters:
                r = dl.record
                print(f"{name}\t{r.aggregate_id}\tv{r.version}\t{r.message_type}\t{dl.reason}\t"
                      f"{dl.error}")
        print(f"{sum(map(len, by_projection.values()))} dead letters")
        for line in _parking_lines(parkings):
            print(line)
        return 0
    key_store = key_store_for(cfg, app)
    schemas = KafkaSchemaStore(cfg.kafka.bootstrap_servers,
                               topics_for(app.name, cfg.kafka.topic_prefix).schemas,
                               cfg.kafka.client_options())
    decode = app.codec_for(schemas, key_store=key_store).decode
    store = open_store(cfg)
    still = 0
    try:
        for p in select(app, sorted(by_projection)):
            base = table_base(app.name, p.name)
            generation = store.generations(base).current
            if generation is None:
                continue
            report = replay_dead_letters(with_personal_columns(store, app, key_store),
                                         Target(p, base, generation), by_projection[p.name],
                                         decode)
            still += report.still_parked
            retrier = _retrier(cfg, app, p, generation, store)
            try:
                closed = retrier.settle()
            finally:
                retrier.close()
            print(f"{p.name}: replayed {report.events} dead letters of {report.aggregates} "
                  f"aggregates; {report.still_parked} still parked"
                  + (f"; {closed} parked views released" if closed else ""))
    finally:
        store.close()
        schemas.close()
    return 1 if still else 0


def _retrier(cfg: CqrsConfig, app: Any, projection: Any, generation: int, store: Any) -> Any:
    from cqrs.topics import topics_for
    from projections.dlq import dead_letter_topic
    from projections.dlq_retry import ProjectionRetrier
    from projections.store import table_base

    topics = topics_for(app.name, cfg.kafka.topic_prefix)
    return ProjectionRetrier(cfg, app, projection, topics.base, table_base(app.name, projection.name),
                             generation, dead_letter_topic(app.name, cfg.kafka.topic_prefix),
                             topics.schemas, store)


def _parkings(cfg: CqrsConfig, app: Any, names: list[str]) -> list[dict[str, Any]]:
    """The parked views of the projections' current generations that the projector retries
    or gave up on, each with its attempts (JSON-ready)."""
    import attrs

    from projections.model import select
    from projections.store import table_base
    from projections.stores import open_store

    out: list[dict[str, Any]] = []
    store = open_store(cfg)
    try:
        for p in select(app, names):
            generation = store.generations(table_base(app.name, p.name)).current
            if generation is None:
                continue
            retrier = _retrier(cfg, app, p, generation, store)
            try:
                for letter, attempts in retrier.open_letters():
                    out.append({"projection": p.name, "generation": generation,
                                "key": letter.aggregate_id, "id": letter.command_id,
                                "state": letter.state, "attempts": letter.attempts,
                                "due_ms": letter.due_ms, "error": letter.error,
                                "history": [{k: v for k, v in attrs.asdict(a).items()
                                             if k not in ("key", "value", "headers", "offsets",
                                                          "command_id", "letter", "note",
                                                          "delivering_ms")}
                                            for a in attempts]})
            finally:
                retrier.close()
    finally:
        store.close()
    return out


def _clock(ms: int | None) -> str:
    import datetime as dt

    return "-" if ms is None else dt.datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S")


def _parking_lines(parkings: list[dict[str, Any]]) -> list[str]:
    if not parkings:
        return ["no parked views waiting for a retry or an operator"]
    lines = [f"{len(parkings)} parked views (the projector retries waiting ones by itself):"]
    for k in parkings:
        what = (f"waiting, attempt {k['attempts'] + 1} due {_clock(k['due_ms'])}"
                if k["state"] == "waiting"
                else f"parked for an operator after {k['attempts']} attempts")
        lines.append(f"{k['projection']} g{k['generation']}\t{k['key']}\t{what}\t{k['error']}")
        for a in k["history"]:
            fate = (f"replayed {_clock(a['delivered_ms'])}: {a['outcome']}" if a["state"] == "replayed"
                    else a["state"] if a["state"] != "waiting" else f"retry due {_clock(a['due_ms'])}")
            lines.append(f"  attempt {a['attempt']}\t{_clock(a['failed_ms'])}\t{a['stage']}\t"
                         f"{a['error']}\t{fate}")
    return lines


def _run_rebuild(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.spark_session import spark_session
    from projections.rebuild import check_rebuild, rebuild_projection

    # refused before Spark starts: what refuses it needs only Kafka and the store
    check_rebuild(cfg, args.app, args.projection, force=args.force)
    spark = spark_session(cfg, f"cqrs-rebuild-{args.projection}")
    rebuild_projection(spark, cfg, args.app, args.projection, drop_old=not args.keep_old and None,
                       force=args.force, allow_dead_letters=args.allow_dead_letters,
                       report=lambda m: print(m, flush=True))
    return 0
