"""Entry point of the ``cqrs`` command: builds the parser from the command modules and runs one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cqrs.cli import (
    app_cmd, config_cmd, demo_cmd, dev_cmd, dlq_cmd, process_cmd, projections_cmd, retrier_cmd,
    run_cmd, scheduler_cmd, send_cmd,
    state_cmd, top_cmd,
)
from cqrs.config import load_config
from cqrs.errors import CqrsError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cqrs",
        description="Event sourcing and CQRS on Kafka, Spark and Cassandra.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML configuration file "
                        "(default: $CQRS_CONFIG, else ./cqrs.toml if present)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    dev_cmd.register(commands)
    demo_cmd.register(commands)
    config_cmd.register(commands)
    run_cmd.register(commands)
    app_cmd.register(commands)
    retrier_cmd.register(commands)
    scheduler_cmd.register(commands)
    process_cmd.register(commands)
    state_cmd.register(commands)
    dlq_cmd.register(commands)
    send_cmd.register(commands)
    projections_cmd.register(commands)
    top_cmd.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        return int(args.run(cfg, args) or 0)
    except CqrsError as exc:
        print(f"cqrs: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cqrs: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
