"""Entry point of the ``cqrs`` command: builds the parser from the command modules and runs one."""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import Final

from cqrs.cli import (
    app_cmd, config_cmd, demo_cmd, dev_cmd, dlq_cmd, forget_cmd, history_cmd, log_cmd, process_cmd,
    projections_cmd, retrier_cmd,
    run_cmd, scheduler_cmd, send_cmd,
    state_cmd, top_cmd,
)
from cqrs.config import load_config
from cqrs.errors import CqrsError

__all__ = ["EXIT_STDOUT_CLOSED", "build_parser", "main"]

# the exit code a shell reports for a command killed by SIGPIPE (128 + 13), as `yes | head` gives
EXIT_STDOUT_CLOSED: Final = 128 + signal.SIGPIPE


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
    history_cmd.register(commands)
    log_cmd.register(commands)
    dlq_cmd.register(commands)
    send_cmd.register(commands)
    forget_cmd.register(commands)
    projections_cmd.register(commands)
    top_cmd.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code. When the reader of standard output goes away
    early (``cqrs state get APP ID | head``), the command stops quietly with
    :data:`EXIT_STDOUT_CLOSED`, as a command killed by SIGPIPE would, not with a traceback."""
    try:
        try:
            code = _main(argv)
        except SystemExit:  # argparse's --help and usage errors print, then exit
            sys.stdout.flush()
            raise
        sys.stdout.flush()  # so a closed pipe shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # a socket's, not ours to hide
        # Python flushes stdout again at exit: give it somewhere to write what is left
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_STDOUT_CLOSED


def _stdout_closed() -> bool:
    """Whether nobody reads standard output any more (a pipe whose reader exited)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no real file behind sys.stdout
        return False


def _main(argv: Sequence[str] | None) -> int:
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
