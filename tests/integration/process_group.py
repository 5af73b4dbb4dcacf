"""Stopping a job the tests started as a process group (``start_new_session=True``): the CLI
process and its Spark JVM and Python workers together."""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["stop"]


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace_s: float = 60.0) -> None:
    """Send ``sig`` to the group of ``proc`` if it still runs, wait ``grace_s``, then SIGKILL."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
