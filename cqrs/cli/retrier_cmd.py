"""``cqrs run retrier <module:app>``: the retry job of an app (dead letters of transient
failures delivered again after their backoff, letters out of attempts parked)."""

from __future__ import annotations

import argparse

from cqrs.cli.run_cmd import job_parsers, say, serve_query
from cqrs.config import CqrsConfig

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    run = job_parsers(commands).add_parser(
        "retrier", help="the retry job: transient dead letters delivered again after a backoff",
        description="Records the app's dead letters in Cassandra (history for `cqrs dlq`), "
        "delivers each transient one to the commands topic again when its backoff is over "
        "(same command id, header cqrs.retry.attempt), parks those out of attempts "
        "(<app>.dead-letters.parked). Settings: [retrier].")
    run.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    run.add_argument("--checkpoint", help="checkpoint folder (default: <checkpoint_dir>/<app>/retrier)")
    run.set_defaults(run=_run_retrier)


def _run_retrier(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.retrier.job import RetrierOptions, checkpoint_for, start_retrier
    from cqrs.spark_session import spark_session

    app = load_app(args.app)
    opts = RetrierOptions(app_ref=args.app, checkpoint=args.checkpoint or checkpoint_for(cfg, app.name))
    spark = spark_session(cfg, f"cqrs-retrier-{app.name}")

    def on_ingest(batch_id: int, s: object) -> None:
        if getattr(s, "letters", 0):
            say(f"batch {batch_id}: {s}")

    def on_round(s: object) -> None:
        if getattr(s, "due", 0):
            say(f"round: {s}")

    query = start_retrier(spark, cfg, opts, on_ingest=on_ingest, on_round=on_round)
    say(f"retrier for {app.name!r} running; checkpoint {opts.checkpoint}")
    return serve_query(query)
