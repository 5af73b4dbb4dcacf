"""``cqrs forget APP SUBJECT``: forget a data subject (delete their key: crypto-shredding)."""

from __future__ import annotations

import argparse

from cqrs.config import CqrsConfig

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    forget = commands.add_parser(
        "forget", help="forget a data subject: delete their key, so their personal fields "
        "read as their replacement everywhere",
        description="Deletes the data subject's key from the app's key store (the table "
        "cqrs_subject_keys of [cassandra] keyspace, wrapped by [personal_data] master_key); "
        "every copy of their personal() fields, in every topic and table, then reads as the "
        "field's replacement. Prints one line; exit 0 when the key was deleted and when there "
        "was none (forgotten before, or never seen: running it again is safe), 2 for bad "
        "input (an empty subject, an app without personal fields). Running processes that "
        "cached the key stop using it within [personal_data] key_cache_seconds. See "
        "docs/personal-data.md.")
    forget.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.ticketing:app)")
    forget.add_argument("subject", help="the data subject's id, as in the messages' subject "
                        "field (e.g. a customer id)")
    forget.set_defaults(run=_run_forget)


def _run_forget(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.personal.stack import check_subject_id, describe_forget, forget_subject

    check_subject_id(args.subject)  # before importing the app
    app = load_app(args.app)
    forgotten = forget_subject(cfg, app, args.subject)
    print(describe_forget(cfg, app, args.subject, forgotten))
    return 0
