"""``cqrs dev install | up | status | down | logs`` and ``cqrs smoke``: the local stack."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from cqrs.config import CqrsConfig
from cqrs.devstack import artifacts
from cqrs.devstack.stack import DevStack, ServiceStatus

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    dev = commands.add_parser("dev", help="the local Kafka + Cassandra stack (no Docker)")
    sub = dev.add_subparsers(dest="action", required=True, metavar="ACTION")
    install = sub.add_parser("install", help="resolve Kafka, Cassandra and the Spark Kafka "
                             "connector from Maven Central into the cache (once), and record "
                             "a Spark driver's classes for faster starts")
    install.set_defaults(run=_install)
    up = sub.add_parser("up", help="start Kafka and Cassandra in the background, wait until healthy")
    up.add_argument("--fresh", action="store_true", help="wipe the stack's data first")
    _cluster_flag(up)
    up.set_defaults(run=_up)
    status = sub.add_parser("status", help="show whether each service runs and answers")
    _cluster_flag(status)
    status.set_defaults(run=_status)
    down = sub.add_parser("down", help="stop the services `up` started (data is kept)")
    _cluster_flag(down)
    down.set_defaults(run=_down)
    logs = sub.add_parser("logs", help="show a service's log")
    logs.add_argument("service", help="kafka or cassandra; with --cluster e.g. cluster-kafka-2, "
                      "cluster-cassandra-1, cluster-spark-master, cluster-spark-worker-1")
    _cluster_flag(logs)
    logs.add_argument("-n", "--lines", type=int, default=50, help="how many last lines (default 50)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.set_defaults(run=_logs)

    smoke = commands.add_parser("smoke", help="prove the stack end to end: Kafka produce/consume, "
                                "Cassandra write/read, a Spark Kafka-to-Kafka streaming query")
    smoke.add_argument("--up", action="store_true", help="run `cqrs dev up` first")
    smoke.set_defaults(run=_smoke)


def _cluster_flag(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--cluster", action="store_true",
                       help="the local cluster instead: 3 Kafka brokers, a Spark standalone "
                       "master and workers, 2 Cassandra nodes (own ports and folder)")
    which.add_argument("--secure", action="store_true",
                       help="the secure stack instead: Kafka over SASL_SSL (SCRAM), Cassandra "
                       "with passwords (own ports and folder, generated certificates and "
                       "credentials)")


def _install(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.devstack.class_archive import build_archive

    artifacts.install(cfg.dev)
    build_archive(cfg)
    print(f"artifacts cached in {cfg.dev.artifacts_path}")
    return 0


def _print_status(statuses: list[ServiceStatus]) -> None:
    print(f"{'service':<22} {'state':<9} {'pid':>7} {'RSS MiB':>8} {'ready in':>9}  endpoint")
    for s in statuses:
        state = "healthy" if s.healthy else ("starting" if s.running else "stopped")
        rss = f"{s.resident_mib:.0f}" if s.resident_mib is not None else "-"
        took = f"{s.started_in_s:.1f} s" if s.started_in_s is not None else "-"
        print(f"{s.name:<22} {state:<9} {s.pid or '-':>7} {rss:>8} {took:>9}  {s.endpoint}")


def _up(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    missing = [c for c in artifacts.COMPONENTS if not artifacts.is_installed(cfg.dev, c)]
    if missing:
        print(f"not installed yet: {', '.join(missing)}; running `cqrs dev install` first")
        artifacts.install(cfg.dev)
    statuses = DevStack(cfg, cluster=args.cluster, secure=args.secure).up(fresh=args.fresh)
    _print_status(statuses)
    if args.cluster:
        from cqrs.devstack.cluster import cluster_config, cluster_toml_path

        on = cluster_config(cfg)
        print(f"\nKafka:     {on.kafka.bootstrap_servers} (replication 3, min.insync.replicas 2)")
        print(f"Cassandra: {on.cassandra.hosts} port {on.cassandra.port}")
        print(f"Spark:     {on.spark.master}")
        print(f"configuration: export CQRS_CONFIG={cluster_toml_path(cfg)}")
        print(f"data in {cfg.dev.cluster_path}; stop with `cqrs dev down --cluster`")
        return 0
    if args.secure:
        from cqrs.devstack.secure import secure_config, secure_toml_path

        on = secure_config(cfg)
        print(f"\nKafka:     {on.kafka.bootstrap_servers} SASL_SSL, {on.kafka.sasl_mechanism} "
              f"user {on.kafka.sasl_username!r}, CA {on.kafka.ssl_ca_location}")
        print(f"Cassandra: {on.cassandra.hosts}:{on.cassandra.port}, role "
              f"{on.cassandra.username!r}")
        print(f"configuration (with the passwords, mode 0600): export "
              f"CQRS_CONFIG={secure_toml_path(cfg)}")
        print(f"data in {cfg.dev.secure_path}; stop with `cqrs dev down --secure`")
        return 0
    print(f"\nKafka:     bootstrap servers {cfg.kafka.bootstrap_servers}   (CQRS_KAFKA_BOOTSTRAP)")
    print(f"Cassandra: {cfg.cassandra.hosts}:{cfg.cassandra.port}   (CQRS_CASSANDRA_HOSTS, CQRS_CASSANDRA_PORT)")
    print(f"data in {cfg.dev.data_path}; stop with `cqrs dev down`")
    return 0


def _status(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    statuses = DevStack(cfg, cluster=args.cluster, secure=args.secure).status()
    _print_status(statuses)
    return 0 if all(s.healthy for s in statuses) else 1


def _down(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    DevStack(cfg, cluster=args.cluster, secure=args.secure).down()
    return 0


def _logs(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    path = DevStack(cfg, cluster=args.cluster, secure=args.secure).log_file(args.service)
    argv = ["tail", f"-n{args.lines}", *(["-F"] if args.follow else []), path]
    return subprocess.call(argv, stdout=sys.stdout, stderr=sys.stderr)


def _smoke(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.devstack.smoke import run_all

    if args.up:
        _up(cfg, argparse.Namespace(fresh=False, cluster=False, secure=False))
    started = time.monotonic()
    run_all(cfg)
    print(f"smoke checks passed in {time.monotonic() - started:.1f} s")
    return 0
