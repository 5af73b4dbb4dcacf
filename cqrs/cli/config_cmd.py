"""``cqrs config show | docs``: the effective configuration and its generated reference."""

from __future__ import annotations

import argparse
import json

import attrs

from cqrs.config import CqrsConfig, settings_reference

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    config = commands.add_parser("config", help="show the effective configuration or its reference")
    sub = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="print the effective settings as JSON (passwords hidden)")
    show.set_defaults(run=_show)
    docs = sub.add_parser("docs", help="print the configuration reference (Markdown)")
    docs.set_defaults(run=_docs)


def _show(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    data = attrs.asdict(cfg)
    for section in data.values():
        for key in section:
            if "password" in key and section[key]:
                section[key] = "***"
    print(json.dumps(data, indent=2))
    return 0


def _docs(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    print(settings_reference())
    return 0
