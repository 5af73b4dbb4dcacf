"""Waiting in integration tests for something the jobs do asynchronously."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["wait_for"]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0,
             log: Callable[[], str] = str, every: float = 0.3) -> Any:
    """``check()``'s first truthy value, polled every ``every`` seconds; after ``timeout`` an
    AssertionError naming ``what`` (with ``log()``, e.g. a job's output)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{log()}")
