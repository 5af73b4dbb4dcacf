"""What a run took from the machine, read from /proc: how busy both cores were, and the peak
resident memory of this process's Spark JVM and its Python workers, sampled while the run goes
on (to show that memory stays flat as the number of aggregates grows).

The Spark JVM is the ``java`` descendant of this process whose command line names
``org.apache.spark.deploy.SparkSubmit`` (how pyspark's gateway starts it); the Python workers
are its descendants running ``pyspark.daemon`` or ``pyspark.worker``. Only descendants of this
process count, so another Spark job on the same box is never measured.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

__all__ = ["ComponentCpu", "MachineCpu", "MemoryPeak", "SparkMemorySampler", "spark_processes"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_MIB = 1024 * 1024


@attrs.frozen
class MemoryPeak:
    """Peaks over a run, in MiB: the JVM, the workers summed, this driver process."""

    jvm_mib: float
    workers_mib: float
    workers: int  # most worker processes seen at once
    driver_mib: float

    def as_dict(self) -> dict[str, float]:
        return attrs.asdict(self)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (0 when it is gone)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * _PAGE / _MIB


def _descendants(root: int) -> Iterator[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            parent = _ppid(int(entry.name))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry.name))
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        yield pid
        stack.extend(children.get(pid, ()))


def spark_processes(root: int | None = None) -> tuple[int | None, list[int]]:
    """``(jvm pid, worker pids)`` among the descendants of ``root`` (default: this process)."""
    jvm: int | None = None
    workers: list[int] = []
    for pid in _descendants(root or os.getpid()):
        cmd = _cmdline(pid)
        if "org.apache.spark.deploy.SparkSubmit" in cmd and "java" in cmd.split(" ", 1)[0]:
            jvm = pid
        elif "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
            workers.append(pid)
    return jvm, workers


class SparkMemorySampler(threading.Thread):
    """Samples every ``interval_s`` until stopped; ``peak()`` gives the maxima seen.

        with SparkMemorySampler() as mem:
            ...                           # the run
        print(mem.peak())
    """

    def __init__(self, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.stopped = threading.Event()
        self._jvm = self._workers = self._driver = 0.0
        self._count = 0

    def sample(self) -> None:
        jvm, workers = spark_processes()
        self._jvm = max(self._jvm, rss_mib(jvm) if jvm else 0.0)
        self._workers = max(self._workers, sum(rss_mib(w) for w in workers))
        self._count = max(self._count, len(workers))
        self._driver = max(self._driver, rss_mib(os.getpid()))

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.sample()

    def peak(self) -> MemoryPeak:
        return MemoryPeak(round(self._jvm), round(self._workers), self._count, round(self._driver))

    def __enter__(self) -> SparkMemorySampler:
        self.sample()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join(5)
        self.sample()


class MachineCpu:
    """How busy the whole machine was between two points, in % of one core (200 = 2 cores),
    from /proc/stat: the box is shared, so each figure carries it."""

    def __init__(self) -> None:
        self.started = (time.monotonic(), self._busy_ticks())

    @staticmethod
    def _busy_ticks() -> int:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
        return sum(fields) - fields[3] - fields[4]  # minus idle and iowait

    def percent(self) -> float:
        wall = time.monotonic() - self.started[0]
        ticks = self._busy_ticks() - self.started[1]
        return round(ticks / os.sysconf("SC_CLK_TCK") / wall * 100) if wall > 0 else 0.0


def _cpu_ticks(pid: int, children: bool) -> int:
    """utime + stime of ``pid`` (plus its reaped children's with ``children``); 0 if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    f = stat[stat.rindex(")") + 2:].split()
    return int(f[11]) + int(f[12]) + ((int(f[13]) + int(f[14])) if children else 0)


class ComponentCpu:
    """CPU seconds each part of a run used between two points, from /proc: the Kafka broker and
    Cassandra (the dev stack's processes), this process's Spark JVM, its Python workers (with
    their reaped children) and this process itself (the load generator and the results
    reader), so a figure shows where the machine's two cores went.

        cpu = ComponentCpu(cfg)
        ...                                  # the run
        print(cpu.seconds())                 # {"kafka": 3.1, "cassandra": 2.0, ...}
    """

    def __init__(self, services: dict[str, int]) -> None:
        self.services = services  # name -> pid (kafka, cassandra)
        self.started = self._ticks()

    def _ticks(self) -> dict[str, int]:
        jvm, workers = spark_processes()
        daemon = [w for w in workers if "pyspark.daemon" in _cmdline(w)]
        out = {name: _cpu_ticks(pid, False) for name, pid in self.services.items()}
        out["spark jvm"] = _cpu_ticks(jvm, False) if jvm else 0
        out["python workers"] = (sum(_cpu_ticks(w, False) for w in workers if w not in daemon)
                                 + sum(_cpu_ticks(d, True) for d in daemon))
        out["bench (load + results)"] = _cpu_ticks(os.getpid(), False)
        return out

    def seconds(self) -> dict[str, float]:
        now, tick = self._ticks(), os.sysconf("SC_CLK_TCK")
        return {k: round(max(0, now[k] - self.started.get(k, 0)) / tick, 2) for k in now}
