"""Plain-text tables for terminal output: the one renderer every command uses."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["render_table"]


def _cell(value: Any, width: int | None) -> str:
    text = "-" if value is None else str(value).replace("\n", " ")
    if width is not None and len(text) > width:
        text = text[: max(width - 1, 1)] + "…"
    return text


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *,
                 max_width: int | None = 60, right: Iterable[str] = ()) -> str:
    """``headers`` and ``rows`` aligned in columns; cells longer than ``max_width`` are cut
    with an ellipsis; columns named in ``right`` (numbers) are right-aligned."""
    cells = [[_cell(v, max_width) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    right_set = set(right)

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if h in right_set else v.ljust(w)
                         for v, w, h in zip(values, widths, headers)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)
