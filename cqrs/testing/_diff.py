"""The diff of expected and actual values every assertion of the test kits shows."""

from __future__ import annotations

import difflib
import pprint
from typing import Any

__all__ = ["diff"]


def diff(expected: Any, actual: Any) -> str:
    """A unified diff of the two values pretty-printed (``-`` expected, ``+`` actual)."""
    lines = difflib.unified_diff(
        pprint.pformat(expected, width=90).splitlines(),
        pprint.pformat(actual, width=90).splitlines(),
        "expected",
        "actual",
        lineterm="",
    )
    return "\n".join(lines)
