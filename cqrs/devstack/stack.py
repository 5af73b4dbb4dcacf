"""The local dev stack: one Kafka broker (KRaft) and one Cassandra node, on loopback.

``up`` is idempotent (a healthy service is left alone), ``down`` stops exactly the processes
``up`` started (recorded PIDs), data survives ``down``/``up`` and ``fresh=True`` wipes it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable

import attrs

from cqrs.config import CqrsConfig
from cqrs.devstack import services
from cqrs.devstack.process import ServiceProcess
from cqrs.errors import DevStackError

__all__ = ["DevStack", "ServiceStatus"]


@attrs.frozen
class ServiceStatus:
    name: str
    running: bool
    healthy: bool
    pid: int | None
    resident_mib: float | None
    endpoint: str
    log_file: str
    started_in_s: float | None = None  # set by ``up`` when it started the service


@attrs.define
class DevStack:
    config: CqrsConfig

    def _services(self) -> dict[str, tuple[ServiceProcess, Callable[[], bool], str]]:
        cfg = self.config
        data = cfg.dev.data_path
        return {
            "kafka": (
                ServiceProcess("kafka", data / "kafka", "-Dcqrs.devstack=kafka"),
                lambda: services.kafka_healthy(cfg),
                cfg.kafka.bootstrap_servers,
            ),
            "cassandra": (
                ServiceProcess("cassandra", data / "cassandra", "-Dcqrs.devstack=cassandra"),
                lambda: services.cassandra_healthy(cfg),
                f"{cfg.cassandra.hosts}:{cfg.cassandra.port}",
            ),
        }

    def _argv(self, name: str) -> list[str]:
        if name == "kafka":
            services.format_kafka_storage(self.config)
            return services.kafka_argv(self.config)
        return services.cassandra_argv(self.config)

    def up(self, fresh: bool = False, say: Callable[[str], None] = print) -> list[ServiceStatus]:
        """Start whatever is not running (both in parallel), wait until healthy, report."""
        if fresh:
            self.down(say=say)
            if self.config.dev.data_path.exists():
                say(f"wiping {self.config.dev.data_path}")
                shutil.rmtree(self.config.dev.data_path)
        started: dict[str, float] = {}
        launched: list[str] = []
        for name, (proc, healthy, endpoint) in self._services().items():
            if proc.pid() is not None:
                say(f"{name}: already running (pid {proc.pid()}) at {endpoint}")
                continue
            if _quiet(healthy):
                raise DevStackError(
                    f"something else already answers at {endpoint} where the dev {name} would "
                    f"listen; stop it or choose other ports (CQRS_DEV_*_PORT settings)"
                )
            started[name] = time.monotonic()
            pid = proc.start(self._argv(name))
            launched.append(name)
            say(f"{name}: starting (pid {pid}), log {proc.log_file}")
        took: dict[str, float] = {}
        try:
            for name in launched:
                proc, healthy, _ = self._services()[name]
                proc.wait_healthy(healthy, self.config.dev.start_timeout_s)
                took[name] = time.monotonic() - started[name]
                say(f"{name}: ready in {took[name]:.1f} s")
        except DevStackError:
            for name in launched:  # leave nothing half-started behind
                self._services()[name][0].stop()
            raise
        statuses = self.status()
        return [attrs.evolve(s, started_in_s=took.get(s.name)) for s in statuses]

    def status(self) -> list[ServiceStatus]:
        out = []
        for name, (proc, healthy, endpoint) in self._services().items():
            pid = proc.pid()
            out.append(ServiceStatus(
                name=name, running=pid is not None,
                healthy=pid is not None and _quiet(healthy), pid=pid,
                resident_mib=proc.resident_mib(), endpoint=endpoint, log_file=str(proc.log_file),
            ))
        return out

    def down(self, say: Callable[[str], None] = print) -> None:
        for name, (proc, _, _) in self._services().items():
            pid = proc.pid()
            if proc.stop():
                say(f"{name}: stopped (pid {pid})")
            else:
                say(f"{name}: not running")

    def log_file(self, name: str) -> str:
        if name not in self._services():
            raise DevStackError(f"unknown service {name!r}; known: kafka, cassandra")
        return str(self._services()[name][0].log_file)


def _quiet(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Exception:
        return False
