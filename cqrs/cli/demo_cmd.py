"""``cqrs demo``: the example apps end to end on the real stack (see domain_examples.demo)."""

from __future__ import annotations

import argparse

from cqrs.config import CqrsConfig

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    demo = commands.add_parser(
        "demo", help="run the example apps end to end on the local stack and check the results",
        description="Starts the local stack if none is running, runs the command processors "
        "and projectors of the bank, orders, loyalty, lending and ticketing examples, lending's "
        "process managers, bank's retry job and orders' deadline scheduler, races clients for loans "
        "across aggregates (each waits for its conversation's end), lets an unpaid order's "
        "payment window run out (a deadline cancels it), sends a scripted workload (a race, rejections, a repeated "
        "command id, a handler crash), prints the answers, dead letters (the topic and the retry "
        "job's record) and read models, forgets a ticketing customer (the read model before and "
        "after), rebuilds a projection, and checks all of it (exit 0: "
        "every check passed). Uses fresh topics, keyspace and checkpoints, removed afterwards.")
    demo.add_argument("--keep", action="store_true",
                      help="leave the stack (if the demo started it), topics, keyspace and "
                      "checkpoints in place")
    demo.add_argument("--no-rebuild", action="store_true", help="skip the projection rebuild")
    demo.set_defaults(run=_run)


def _run(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from domain_examples.demo import DemoOptions, run_demo  # the CLI is the top floor

    opts = DemoOptions(keep=args.keep, rebuild=None if args.no_rebuild else DemoOptions().rebuild)
    return run_demo(cfg, opts)
