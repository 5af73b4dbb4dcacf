"""What one aggregate's state row costs to keep, all processes counted: the processor's
Cassandra state table (``StateTable.start_writing`` in the processor's 12,500-row chunks, then
the node's flush and the compactions it causes) against a compacted Kafka topic of the same
rows (one record per row, keyed by aggregate id, as a changelog). Prints CPU microseconds per
row: this process (the driver or librdkafka, with the Python around them), Kafka, Cassandra.

    python bench/state_store.py                  # 300,000 rows of 260 bytes, three rounds

Needs the local stack (``cqrs dev up``). The rows' records are random bytes (a state record's
message ids and hashes barely compress either). A figure to rank a state-store design by, not
a processor's throughput: the rows are made before the clock starts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import announce, fresh_topics, remove_fresh, stack_pids  # noqa: E402
from procmem import ComponentCpu  # noqa: E402
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.kafka_io import make_admin, make_producer  # noqa: E402
from cqrs.processor.state_table import StoredAggregate, open_state_table  # noqa: E402

CHUNK = 12_500  # rows per StateTable.start_writing call, as the processor's slices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--record-bytes", type=int, default=260)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-settle", action="store_true",
                    help="skip Cassandra's flush and compactions (the tests' smoke run)")
    args = ap.parse_args()
    cfg = load_config()
    try:
        measure(cfg, args)
    finally:
        remove_fresh(cfg)


def measure(cfg: CqrsConfig, args: argparse.Namespace) -> None:
    from confluent_kafka.admin import NewTopic

    from cqrs.devstack.nodetool import flush_and_compact

    topics = fresh_topics(cfg, "statestore", "statestore")
    changelog = f"{topics.base}.changelog"  # under the fresh prefix: remove_fresh deletes it
    admin = make_admin(cfg)
    for done in admin.create_topics(
            [NewTopic(changelog, 4, 1, config={"cleanup.policy": "compact"})]).values():
        done.result()
    table = open_state_table(cfg, topics)
    generation = table.ensure_current()
    producer = make_producer(cfg)
    n = args.rows
    rows = [StoredAggregate(f"account-{i}", "Account", 3, False, os.urandom(args.record_bytes),
                            i % 4, i, 3) for i in range(n)]

    def cassandra() -> None:
        for start in range(0, n, CHUNK):
            table.start_writing(generation, rows[start:start + CHUNK])()

    def flush() -> None:
        if not args.no_settle:
            flush_and_compact(cfg)

    def kafka() -> None:
        for row in rows:
            while True:
                try:
                    producer.produce(changelog, row.packed(), row.aggregate_id.encode(),
                                     partition=row.source_partition)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.flush()

    parts: list[tuple[str, Callable[[], None]]] = [
        ("cassandra rows", cassandra), ("cassandra flush", flush), ("kafka changelog", kafka)]
    pids = stack_pids(cfg)
    try:
        for round_ in range(1, args.rounds + 1):
            announce(f"round {round_}: {n:,} rows of {args.record_bytes} bytes")
            for label, run in parts:
                cpu = ComponentCpu(pids)
                mine, wall = time.process_time(), time.monotonic()
                run()
                mine, wall = time.process_time() - mine, time.monotonic() - wall
                used = cpu.seconds()
                print(f"RESULT {label} round={round_}: wall {wall / n * 1e6:.1f} us/row, CPU "
                      f"us/row: this process {mine / n * 1e6:.1f}, "
                      + ", ".join(f"{k} {used.get(k, 0.0) / n * 1e6:.1f}" for k in sorted(pids)),
                      flush=True)
    finally:
        table.close()


if __name__ == "__main__":
    main()
