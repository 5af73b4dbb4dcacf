"""Background service processes, tracked by the PID files they were started with.

A service is stopped through its recorded PID only, never by name, and only if that PID still
runs the command line we started (a PID can be reused by an unrelated process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from cqrs.errors import DevStackError, ServiceNotReady

__all__ = ["ServiceProcess"]


@attrs.define
class ServiceProcess:
    """One long-running service: its command, folder, log and PID file."""

    name: str
    workdir: Path
    marker: str  # a string unique to our command line, checked before signalling a PID

    @property
    def pid_file(self) -> Path:
        return self.workdir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The PID of our running process, or None (a stale PID file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        cmdline = None if _gone(pid) else _cmdline(pid)
        # an exiting process (zombie leader, threads still running) has an empty command line
        if cmdline is None or (cmdline and self.marker not in cmdline):
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def start(self, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.workdir, env=env, start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        return proc.pid

    def wait_healthy(self, check: Callable[[], bool], timeout_s: float) -> float:
        """Poll ``check`` until it returns True; seconds waited. Raises naming the log file."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.pid() is None:
                raise ServiceNotReady(
                    f"{self.name} exited during start-up; see its log {self.log_file}:\n"
                    f"{self.log_tail()}"
                )
            try:
                if check():
                    return time.monotonic() - started
            except Exception:  # not up yet: connection refused, timeouts, ...
                pass
            time.sleep(0.5)
        raise ServiceNotReady(
            f"{self.name} did not become healthy within {timeout_s:.0f} s; see its log "
            f"{self.log_file}:\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 60.0) -> bool:
        """SIGTERM our process group, then SIGKILL after ``timeout_s``; False if none ran."""
        pid = self.terminate()
        if pid is None:
            return False
        self.wait_stopped(pid, timeout_s)
        return True

    def terminate(self) -> int | None:
        """SIGTERM our process group without waiting; its PID, or None if none ran (then
        :meth:`wait_stopped`). Stopping several services at once: signal each, then wait."""
        pid = self.pid()
        if pid is None:
            return None
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        return pid

    def wait_stopped(self, pid: int, timeout_s: float = 60.0) -> None:
        """Wait until ``pid`` (signalled by :meth:`terminate`) is gone, SIGKILL its group after
        ``timeout_s``; the PID file is removed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not _gone(pid):
            time.sleep(0.2)
        if not _gone(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while not _gone(pid):
                time.sleep(0.1)
        self.pid_file.unlink(missing_ok=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "".join(self.log_file.read_text(errors="replace").splitlines(True)[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def resident_mib(self) -> float | None:
        """Resident memory of the process in MiB (Linux /proc), or None if not running."""
        pid = self.pid()
        if pid is None:
            return None
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except FileNotFoundError:
            return None
        return None


def _gone(pid: int) -> bool:
    """True once the process has fully exited (reaping it first if it is our child).

    A multi-threaded process whose main thread ended shows as a zombie while its other
    threads still run; it is gone only when ``/proc/<pid>`` is.
    """
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return not Path(f"/proc/{pid}").exists()


def _cmdline(pid: int) -> str | None:
    """The command line of a process ('' while it exits), or None if there is none."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")
