"""The local dev stack on loopback: one Kafka broker (KRaft) and one Cassandra node, or with
``cluster=True`` three brokers, a Spark standalone master with its workers and several
Cassandra nodes (see :mod:`cqrs.devstack.cluster`).

``up`` is idempotent (a healthy service is left alone), ``down`` stops exactly the processes
``up`` started (recorded PIDs), data survives ``down``/``up`` and ``fresh=True`` wipes it.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from cqrs.config import CqrsConfig
from cqrs.devstack import services
from cqrs.devstack.process import ServiceProcess
from cqrs.errors import DevStackError

__all__ = ["DevStack", "Service", "ServiceStatus"]


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


@attrs.frozen
class Service:
    """One service of a stack: its process, how to launch and check it, where it answers.

    ``wave``: services of a wave start together once every service of the earlier waves is
    healthy (a Spark worker needs its master)."""

    name: str
    process: ServiceProcess
    argv: Callable[[], list[str]]
    healthy: Callable[[], bool]
    endpoint: str
    wave: int = 0
    env: dict[str, str] | None = None


@attrs.define
class DevStack:
    config: CqrsConfig
    cluster: bool = False
    secure: bool = False  # one broker over SASL_SSL and one Cassandra node with passwords

    def __attrs_post_init__(self) -> None:
        if self.cluster and self.secure:
            raise DevStackError("choose --cluster or --secure: the cluster is not secured")

    @property
    def data_path(self) -> Path:
        if self.secure:
            return self.config.dev.secure_path
        return self.config.dev.cluster_path if self.cluster else self.config.dev.data_path

    def _services(self) -> dict[str, Service]:
        if self.secure:
            from cqrs.devstack.secure import secure_services

            return {s.name: s for s in secure_services(self.config)}
        if self.cluster:
            from cqrs.devstack.cluster import cluster_services

            return {s.name: s for s in cluster_services(self.config)}
        cfg = self.config
        kafka, cassandra = services.kafka_node(cfg), services.cassandra_node(cfg)

        def kafka_argv() -> list[str]:
            services.format_kafka_storage(cfg, kafka)
            return services.kafka_argv(cfg, kafka)

        return {
            "kafka": Service(
                "kafka", ServiceProcess("kafka", kafka.workdir, kafka.marker), kafka_argv,
                lambda: services.kafka_healthy(cfg), cfg.kafka.bootstrap_servers),
            "cassandra": Service(
                "cassandra", ServiceProcess("cassandra", cassandra.workdir, cassandra.marker),
                lambda: services.cassandra_argv(cfg, cassandra),
                lambda: services.cassandra_healthy(cfg),
                f"{cfg.cassandra.hosts}:{cfg.cassandra.port}"),
        }

    def up(self, fresh: bool = False, say: Callable[[str], None] = print) -> list[ServiceStatus]:
        """Start whatever is not running (a wave in parallel), wait until healthy, report."""
        if fresh:
            self.down(say=say)
            if self.data_path.exists():
                say(f"wiping {self.data_path}")
                shutil.rmtree(self.data_path)
        all_services = self._services()
        started: dict[str, float] = {}
        launched: list[str] = []
        took: dict[str, float] = {}
        try:
            for wave in sorted({s.wave for s in all_services.values()}):
                this_wave = []
                for name, svc in all_services.items():
                    if svc.wave != wave:
                        continue
                    proc = svc.process
                    if proc.pid() is not None:
                        say(f"{name}: already running (pid {proc.pid()}) at {svc.endpoint}")
                        continue
                    if _quiet(svc.healthy):
                        raise DevStackError(
                            f"something else already answers at {svc.endpoint} where the dev "
                            f"{name} would listen; stop it or choose other ports (CQRS_DEV_* "
                            "port settings)"
                        )
                    started[name] = time.monotonic()
                    pid = proc.start(svc.argv(), env=svc.env)
                    launched.append(name)
                    this_wave.append(name)
                    say(f"{name}: starting (pid {pid}), log {proc.log_file}")
                for name in this_wave:
                    svc = all_services[name]
                    svc.process.wait_healthy(svc.healthy, self.config.dev.start_timeout_s)
                    took[name] = time.monotonic() - started[name]
                    say(f"{name}: ready in {took[name]:.1f} s")
        except DevStackError:
            for name in reversed(launched):  # leave nothing half-started behind
                all_services[name].process.stop()
            raise
        if self.cluster:
            from cqrs.devstack.cluster import cluster_toml, cluster_toml_path

            cluster_toml_path(self.config).write_text(cluster_toml(self.config))
        if self.secure:
            from cqrs.devstack.secure import create_role, write_secure_toml

            create_role(self.config)
            write_secure_toml(self.config)
        statuses = self.status()
        return [attrs.evolve(s, started_in_s=took.get(s.name)) for s in statuses]

    def status(self) -> list[ServiceStatus]:
        out = []
        for name, svc in self._services().items():
            pid = svc.process.pid()
            out.append(ServiceStatus(
                name=name, running=pid is not None,
                healthy=pid is not None and _quiet(svc.healthy), pid=pid,
                resident_mib=svc.process.resident_mib(), endpoint=svc.endpoint,
                log_file=str(svc.process.log_file),
            ))
        return out

    def down(self, say: Callable[[str], None] = print) -> None:
        """Stop every service: all are signalled at once, then waited for (each gets SIGKILL
        60 s after its SIGTERM).

        At once, not one after the other, so that ``down`` takes the longest stop, not their
        sum. (The cluster's brokers stop without a controlled shutdown, see
        ``services._kafka_properties``: with one, a broker whose shutdown came after the other
        two's waited for a controller quorum that was gone and only ended with the SIGKILL.)"""
        signalled: list[tuple[str, Service, int]] = []
        for name, svc in reversed(list(self._services().items())):
            pid = svc.process.terminate()
            if pid is None:
                say(f"{name}: not running")
            else:
                signalled.append((name, svc, pid))
        for name, svc, pid in signalled:
            svc.process.wait_stopped(pid)
            say(f"{name}: stopped (pid {pid})")

    def log_file(self, name: str) -> str:
        known = self._services()
        if name not in known:
            raise DevStackError(f"unknown service {name!r}; known: {', '.join(known)}")
        return str(known[name].process.log_file)


def _quiet(check: Callable[[], bool]) -> bool:
    try:
        return check()
    except Exception:
        return False
