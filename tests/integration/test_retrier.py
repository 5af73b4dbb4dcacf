"""The retry job on the real stack: a processor and a retrier (``cqrs run processor`` / ``cqrs
run retrier``, separate processes) over topics of their own, the flaky app's handler calling a
stand-in service that fails while a flag file says so."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.client import CommandClient
from cqrs.config import CqrsConfig
from cqrs.kafka_io import KafkaRecord, read_to_end
from cqrs.retrier.plan import delay_s
from cqrs.retrier.store import RetryStore
from cqrs.retries import ATTEMPT_HEADER
from cqrs.topics import AppTopics, ensure_topics, topics_for

APPS = Path(__file__).parent / "apps"
sys.path.insert(0, str(APPS))
import flaky_app  # noqa: E402
from process_group import Jobs
from waiting import wait_for

APP_REF = "flaky_app:app"
LATE_S = 20.0  # how late a retry may be after its backoff (it is ~1-2 s late here)
app = flaky_app.app


@attrs.define
class Stack:
    cfg: CqrsConfig
    topics: AppTopics
    tmp: Path
    client: CommandClient
    jobs: Jobs

    def start(self, job: str, *extra: str) -> None:
        self.jobs.run(job, "run", job, APP_REF, *extra)

    def flag(self, failures: int, slow: bool = False) -> str:
        path = self.tmp / f"flag-{uuid.uuid4().hex[:8]}"
        path.write_text(f"{failures} slow" if slow else str(failures))
        return str(path)

    def store(self) -> RetryStore:
        return RetryStore(self.cfg, self.topics.base)


def calls(flag: str) -> list[float]:
    path = Path(flag).with_suffix(".calls")
    return [float(x) for x in path.read_text().split()] if path.exists() else []


@pytest.fixture(scope="module")
def stack(cqrs_config: CqrsConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("retrier")
    prefix = f"t-retrier-{uuid.uuid4().hex[:8]}-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     spark={"checkpoint_dir": str(tmp / "ck")})
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), *sys.path]),
           "CQRS_KAFKA_TOPIC_PREFIX": prefix, "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": str(tmp / "ck"), "CQRS_RETRIER_INTERVAL": "0.5",
           "CQRS_RETRIER_TRIGGER": "500 milliseconds", "CQRS_METRICS_PORT": "0"}
    s = Stack(cfg, topics, tmp, CommandClient(app, cfg), Jobs(tmp, env))
    s.start("processor", "--trigger", "300 milliseconds")
    s.start("retrier")
    try:
        warm = s.client.send_and_wait("warm-up", flaky_app.Charge(1, s.flag(1)), timeout=180)
        assert warm.status == "accepted", s.jobs.log("processor") + s.jobs.log("retrier")
        yield s
    finally:
        s.client.close()
        s.jobs.stop_all()


def results_of(s: Stack, command_id: str) -> list[Any]:
    return [app.codec.decode(r.value) for r in read_to_end(s.cfg, [s.topics.results])
            if r.key == command_id.encode()]


def deliveries(s: Stack, command_id: str) -> list[KafkaRecord]:
    """The records of the commands topic that retry ``command_id`` (attempt 2, 3...)."""
    out = []
    for r in read_to_end(s.cfg, [s.topics.commands]):
        headers = dict(r.headers)
        if ATTEMPT_HEADER in headers and r.value is not None and command_id.encode() in r.value:
            out.append(r)
    return out


def test_fails_twice_then_accepted_once(stack: Stack) -> None:
    flag = stack.flag(2)
    result = stack.client.send_and_wait("wallet-1", flaky_app.Charge(5, flag), timeout=60)
    assert result.status == "accepted" and result.version == 1
    assert len(calls(flag)) == 3  # two failures, one success
    assert [r.status for r in results_of(stack, result.command_id)] == ["accepted"]
    events = [e for e in read_to_end(stack.cfg, [stack.topics.events]) if e.key == b"wallet-1"]
    assert len(events) == 1
    attempts = [dict(h.headers)[ATTEMPT_HEADER] for h in deliveries(stack, result.command_id)]
    assert sorted(attempts) == [b"2", b"3"]
    store = stack.store()
    try:
        history = wait_for("the history", lambda: [
            a for a in store.attempts(result.command_id) if a.state == "delivered"] and
            store.attempts(result.command_id))
        assert [(a.attempt, a.error_type, a.state) for a in history] == [
            (1, "ServiceUnavailable", "delivered"), (2, "ServiceUnavailable", "delivered")]
        assert history[0].outcome == "failed again"
        letter = wait_for("the letter done", lambda: (
            (row := store.letter(result.command_id)) is not None and row.state == "done" and row))
        assert letter.attempts == 2
    finally:
        store.close()


def test_always_failing_is_parked_after_its_attempts_with_backoff_intervals(stack: Stack) -> None:
    flag = stack.flag(999)
    result = stack.client.send_and_wait("wallet-2", flaky_app.Charge(5, flag), timeout=90)
    assert result.status == "failed" and result.error_type == "ServiceUnavailable"
    runs = calls(flag)
    assert len(runs) == flaky_app.BACKOFF.max_attempts  # every retry came, none was lost
    expected = [delay_s(app.retries, "flaky.Charge", "ServiceUnavailable", result.command_id,
                        attempt) for attempt in range(1, len(runs))]
    gaps = [after - before for before, after in zip(runs, runs[1:], strict=False)]
    print("retries late by (s):", [round(g - e, 2) for g, e in zip(gaps, expected, strict=True)])
    for attempt, (gap, wait) in enumerate(zip(gaps, expected, strict=True), start=1):
        # never early; and late by the timer, the ingest trigger and the processor's batch
        # (~1-2 s), not by a wait for something else (the next letter, a restart): LATE_S is
        # an order of magnitude above the first, so a loaded machine does not fail it
        assert wait - 0.25 <= gap <= wait + LATE_S, (attempt, gap, wait)
    parked = wait_for("the parked letter", lambda: [
        r for r in read_to_end(stack.cfg, [stack.topics.parked]) if r.key == b"wallet-2"])
    assert len(parked) == 1
    store = stack.store()
    try:
        letter = wait_for("the letter parked", lambda: (
            (row := store.letter(result.command_id)) is not None and row.state == "parked" and row))
        assert letter.attempts == flaky_app.BACKOFF.max_attempts
        history = store.attempts(result.command_id)
        assert history[-1].outcome == "parked"
        # each retry was planned after its own backoff (to the ms: the retrier's clock is the
        # letter's timestamp, not this machine's speed) and delivered once due, not before
        retried = [a for a in history if not a.final]
        assert [a.attempt for a in retried] == list(range(1, len(runs))), history
        for a, wait in zip(retried, expected, strict=True):
            assert a.failed_ms is not None and a.due_ms == a.failed_ms + round(wait * 1000), a
            assert a.state == "delivered" and a.delivering_ms is not None, a
            assert a.delivering_ms >= a.due_ms, a
    finally:
        store.close()


def test_a_poison_command_never_delays_other_aggregates(stack: Stack) -> None:
    poison = stack.client.send("poison", flaky_app.Charge(1, stack.flag(999)))
    others = [stack.client.send(f"healthy-{i}", flaky_app.Charge(i, stack.flag(0)))
              for i in range(20)]
    answers = [stack.client.wait(f, timeout=30) for f in others]
    assert all(a.status == "accepted" for a in answers)
    # the poison command is still in its backoff when every other one has its answer
    assert not poison.done()
    assert stack.client.wait(poison, timeout=90).status == "failed"


def test_sigkill_mid_backoff_then_restart_delivers_each_due_letter_once(stack: Stack) -> None:
    # the slow error's backoff (6 s +- 20 %) keeps every letter waiting long enough to see them
    # all waiting at once, however the processor and the job batch them
    flags = [stack.flag(1, slow=True) for _ in range(6)]
    futures = [stack.client.send(f"crash-{i}", flaky_app.Charge(1, f)) for i, f in enumerate(flags)]
    store = stack.store()
    try:
        wait_for("the letters waiting", lambda: all(
            (row := store.letter(f.command_id)) is not None and row.state == "waiting"
            for f in futures))
        stack.jobs.kill("retrier")  # mid-backoff: every retry is due within ~7.2 s
        time.sleep(8.0)  # they all fall due while the job is dead
        stack.start("retrier")
        answers = [stack.client.wait(f, timeout=120) for f in futures]
        assert [a.status for a in answers] == ["accepted"] * len(futures), stack.jobs.log("retrier")
        for f, flag in zip(futures, flags, strict=True):
            assert len(calls(flag)) == 2, flag  # the failure and one retry, not two
            assert len(deliveries(stack, f.command_id)) == 1
            assert [r.status for r in results_of(stack, f.command_id)] == ["accepted"]
    finally:
        store.close()
