"""Jobs the tests start as ``cqrs`` subprocesses, each in its own process group
(``start_new_session=True``), so stopping one stops the CLI process and its Spark JVM and Python
workers together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import attrs

__all__ = ["Jobs", "stop"]


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace_s: float = 60.0) -> None:
    """Stop ``proc`` if it still runs: SIGTERM to the ``cqrs`` process alone (it stops its
    queries between micro-batches, then its JVM; a JVM signalled too would end at once), any
    other signal to its whole group; after ``grace_s`` SIGKILL, then SIGKILL to whatever of
    the group is left."""
    if proc.poll() is None:
        if sig == signal.SIGTERM:
            os.kill(proc.pid, sig)
        else:
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone already
        pass


@attrs.define
class Jobs:
    """A test's running ``cqrs`` commands by name, each logging to ``<tmp>/<name>.log``."""

    tmp: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = attrs.Factory(dict)

    def run(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """Start ``cqrs <args>`` as job ``name``."""
        with (self.tmp / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", *args], env=self.env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        stop(self.procs.pop(name), sig)

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGTERM)
