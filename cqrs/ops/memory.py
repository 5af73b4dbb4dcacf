"""Resident memory of processes, read from ``/proc`` (Linux): what ``cqrs run app`` reports
for its driver JVM, itself and the Python workers Spark forks."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["children", "rss_bytes", "tree_rss_bytes"]

_PROC = Path("/proc")


def rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` in bytes (0 when the process is gone or /proc is missing)."""
    try:
        for line in (_PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def children(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in _PROC.glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def tree_rss_bytes(pid: int | None = None) -> int:
    """RSS of ``pid`` (default: this process) and all its descendants."""
    root = os.getpid() if pid is None else pid
    return rss_bytes(root) + sum(rss_bytes(c) for c in children(root))
