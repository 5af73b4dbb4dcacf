"""The read side's commands: ``cqrs run projector``, ``cqrs projections status|dlq`` and
``cqrs rebuild``. The CLI is the one layer that sees both ``cqrs`` and ``projections``."""

from __future__ import annotations

import argparse
import collections
import json

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
    dlq = sub.add_parser("dlq", help="list or replay the projections' dead letters")
    dlq.add_argument("app", help=_APP_HELP)
    dlq.add_argument("action", choices=["list", "replay"])
    dlq.add_argument("--projection", default=None, help="only this projection")
    dlq.set_defaults(run=_run_dlq)

    rebuild = commands.add_parser(
        "rebuild", help="rebuild a projection from the event log into a new generation",
        description="Replays the events topic into new tables while readers use the current "
        "ones, then switches readers atomically and drops the old tables.")
    rebuild.add_argument("app", help=_APP_HELP)
    rebuild.add_argument("projection", help="the projection's name")
    rebuild.add_argument("--keep-old", action="store_true", help="do not drop the old generation")
    rebuild.add_argument("--force", action="store_true",
                         help="start over although a rebuild is recorded as under way")
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
    from cqrs.topics import topics_for
    from projections.apply import Target
    from projections.dlq import dead_letter_topic, read_dead_letters, replay_dead_letters
    from projections.model import select
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
        for name, letters in sorted(by_projection.items()):
            for dl in letters:
                r = dl.record
                print(f"{name}\t{r.aggregate_id}\tv{r.version}\t{r.message_type}\t{dl.reason}\t"
                      f"{dl.error}")
        print(f"{sum(map(len, by_projection.values()))} dead letters")
        return 0
    schemas = KafkaSchemaStore(cfg.kafka.bootstrap_servers,
                               topics_for(app.name, cfg.kafka.topic_prefix).schemas,
                               cfg.kafka.client_options())
    decode = app.codec_for(schemas).decode
    store = open_store(cfg)
    still = 0
    try:
        for p in select(app, sorted(by_projection)):
            base = table_base(app.name, p.name)
            generation = store.generations(base).current
            if generation is None:
                continue
            report = replay_dead_letters(store, Target(p, base, generation), by_projection[p.name],
                                         decode)
            still += report.still_parked
            print(f"{p.name}: replayed {report.events} dead letters of {report.aggregates} "
                  f"aggregates; {report.still_parked} still parked")
    finally:
        store.close()
        schemas.close()
    return 1 if still else 0


def _run_rebuild(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.spark_session import spark_session
    from projections.rebuild import rebuild_projection

    spark = spark_session(cfg, f"cqrs-rebuild-{args.projection}")
    rebuild_projection(spark, cfg, args.app, args.projection, drop_old=not args.keep_old and None,
                       force=args.force, report=lambda m: print(m, flush=True))
    return 0
