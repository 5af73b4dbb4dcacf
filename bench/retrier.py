"""What one round of the retry job's timer costs with 10 and with 10,000 letters waiting.
Prints figures.

    python bench/retrier.py                        # 10 and 10,000 waiting, 40 rounds each

For each size, letters of transient failures are recorded (due in an hour, so they wait), then
the timer's round (:meth:`cqrs.retrier.service.Retrier.deliver_due`) is timed: ``--rounds``
rounds with nothing due, then ``--rounds`` rounds each delivering ``--due`` letters that fell
due (recorded with a time in the past just before the round; delivery produces to Kafka and
updates Cassandra). The round reads the due slice of the bucket(s) from its cursor to now, so
its cost should follow what is due, not what waits. Needs the local stack (``cqrs dev up``);
the job's Spark query (ingest) is not involved: its cost follows new letters, not waiting ones.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration" / "apps"))

import flaky_app  # noqa: E402
from cqrs.client import encode_command  # noqa: E402
from cqrs.config import CqrsConfig, load_config  # noqa: E402
from cqrs.kafka_io import KafkaRecord  # noqa: E402
from cqrs.processor.step import DLQ_PREFIX  # noqa: E402
from cqrs.retrier.service import Retrier  # noqa: E402
from cqrs.topics import AppTopics, ensure_topics, topics_for  # noqa: E402

app = flaky_app.app


def letters(topics: AppTopics, tag: str, n: int, at_ms: int, first_offset: int) -> list[KafkaRecord]:
    out = []
    for i in range(n):
        _, key, value, headers = encode_command(app, f"{tag}-{i}", flaky_app.Charge(1, "/none"),
                                                command_id=f"{tag}-{i}")
        dlq = [("stage", "handler"), ("error_type", "ServiceUnavailable"), ("error", "down"),
               ("topic", topics.commands), ("partition", "0"), ("offset", str(i)),
               ("transient", "1"), ("attempt", "1"), ("final", "0")]
        out.append(KafkaRecord(topics.dead_letters, 0, first_offset + i, key, value,
                               [*headers, *((DLQ_PREFIX + k, v.encode()) for k, v in dlq)], at_ms))
    return out


def ms(values: list[float]) -> str:
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"p50 {statistics.median(values) * 1000:6.2f} ms  p99 {p99 * 1000:6.2f} ms"


def run(cfg: CqrsConfig, waiting: int, rounds: int, due: int) -> None:
    topics = topics_for(app.name, f"bench-retrier-{uuid.uuid4().hex[:8]}-")
    ensure_topics(cfg, topics)
    retrier = Retrier(cfg, app, topics)
    try:
        started = time.perf_counter()
        now = int(time.time() * 1000)
        for start in range(0, waiting, 2000):
            retrier.ingest(letters(topics, "wait", min(2000, waiting - start), now + 3600_000, start))
        recorded_s = time.perf_counter() - started
        retrier.deliver_due()  # the first round moves the cursor to now
        idle, busy, buckets = [], [], set()
        for _ in range(rounds):
            s = retrier.deliver_due()
            assert s.due == 0
            idle.append(s.seconds)
            buckets.add(s.buckets_read)
        offset = 10**6
        for r in range(rounds):
            retrier.ingest(letters(topics, f"due{r}", due, int(time.time() * 1000) - 60_000, offset))
            offset += due
            s = retrier.deliver_due()
            assert s.delivered == due, s
            busy.append(s.seconds)
            buckets.add(s.buckets_read)
        print(f"{waiting:>6} waiting (recorded in {recorded_s:5.1f} s): round with nothing due "
              f"{ms(idle)}; round delivering {due}: {ms(busy)}; buckets read per round "
              f"{sorted(buckets)}", flush=True)
    finally:
        retrier.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,10000", help="waiting letters, comma separated")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--due", type=int, default=10, help="letters due per busy round")
    args = parser.parse_args()
    cfg = load_config()
    for size in (int(x) for x in args.sizes.split(",")):
        run(cfg, size, args.rounds, args.due)


if __name__ == "__main__":
    main()
