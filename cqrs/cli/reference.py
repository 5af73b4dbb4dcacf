"""The CLI reference (docs/cli.md), generated from the argparse parser so it cannot drift.

    python -m cqrs.cli.reference > docs/cli.md
"""

from __future__ import annotations

import argparse

__all__ = ["cli_reference"]

_HEADER = """# CLI reference

Generated from the parser by `python -m cqrs.cli.reference > docs/cli.md`; a test keeps this
file current. Every command takes the global `--config FILE` option (a TOML file, see
[configuration.md](configuration.md)) and exits 0 on success, 2 on a usage or framework error
(printed as `cqrs: error: ...`), 130 when interrupted, and 141 without a word when the reader
of its output goes away early (`cqrs state get APP ID | head`), as a command killed by SIGPIPE
does (a shell with `set -o pipefail` sees that status, as for `yes | head`).
"""


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:  # argparse keeps sub-parsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _walk(parser: argparse.ArgumentParser, path: list[str], out: list[str]) -> None:
    children = _subcommands(parser)
    if children and path:
        out.append(f"{'#' * min(len(path) + 1, 4)} `cqrs {' '.join(path)}`\n")
        if parser.description:
            out.append(parser.description.strip() + "\n")
    for name, child in children:
        _walk(child, [*path, name], out)
    if not children:
        out.append(f"{'#' * min(len(path) + 1, 4)} `cqrs {' '.join(path)}`\n")
        if parser.description:
            out.append(parser.description.strip() + "\n")
        usage = child_usage(parser)
        out.append(f"```text\n{usage}```\n")


def child_usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=100, max_help_position=32)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        formatter.start_section(group.title)
        formatter.add_arguments(actions)
        formatter.end_section()
    return formatter.format_help()


def cli_reference() -> str:
    """Markdown describing every ``cqrs`` command, its arguments and options."""
    from cqrs.cli.main import build_parser

    parser = build_parser()
    parser.prog = "cqrs"
    out = [_HEADER]
    _walk(parser, [], out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(cli_reference(), end="")
