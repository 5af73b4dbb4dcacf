"""``cqrs forget APP SUBJECT``: forget a data subject (delete their key: crypto-shredding)."""

from __future__ import annotations

import argparse
from typing import Any

from cqrs.config import CqrsConfig

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    forget = commands.add_parser(
        "forget", help="forget a data subject: delete their key, so their personal fields "
        "read as their replacement everywhere",
        description="Records the request (table cqrs_forget_requests), deletes the data subject's key "
        "from the app's key store (the table cqrs_subject_keys of [cassandra] keyspace, "
        "wrapped by [personal_data] master_key), so every copy of their personal() fields, in "
        "every topic and table, reads as the field's replacement, then rewrites their rows of "
        "the read models with personal columns to the replacement, and marks the request "
        "done; a run stopped at any point is finished by running it again. Prints a line per "
        "step and a summary; exit 0 when the key was deleted and when there "
        "was none (forgotten before, or never seen: running it again is safe), 2 for bad "
        "input (an empty subject, an app without personal fields). Running processes that "
        "cached the key stop using it within [personal_data] key_cache_seconds. See "
        "docs/personal-data.md.")
    forget.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.ticketing:app)")
    forget.add_argument("subject", help="the data subject's id, as in the messages' subject "
                        "field (e.g. a customer id)")
    forget.set_defaults(run=_run_forget)


def forget_steps(app: Any) -> list[Any]:
    """What rewrites copies of personal data besides the key: the read models' step when a
    projection of the app has personal columns (the CLI sees both sides)."""
    if not any(getattr(p, "personal_columns", None) for p in app.projections):
        return []
    from projections.personal import forget_step

    return [forget_step]


def _run_forget(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.loading import load_app
    from cqrs.personal.stack import check_subject_id, describe_forget, forget

    check_subject_id(args.subject)  # before importing the app
    app = load_app(args.app)
    outcome = forget(cfg, app, args.subject, steps=forget_steps(app),
                     report=lambda line: print(f"  {line}", flush=True))
    print(describe_forget(cfg, app, args.subject, outcome))
    return 0
