"""``cqrs dlq list|show|retry|park|purge`` and ``/dead-letters`` over letters the retry job
recorded (real Kafka and Cassandra; the job's ingest and timer run in-process, without Spark)."""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from cqrs.cli.main import main
from cqrs.client import encode_command
from cqrs.config import CqrsConfig
from cqrs.envelope import from_kafka
from cqrs.kafka_io import KafkaRecord, make_producer, read_to_end
from cqrs.processor.step import DLQ_PREFIX
from cqrs.results import ACCEPTED, CommandResult
from cqrs.retrier.service import Retrier
from cqrs.topics import AppTopics, ensure_topics, topics_for

sys.path.insert(0, str(Path(__file__).parent / "apps"))
import flaky_app  # noqa: E402

APP_REF = "flaky_app:app"
app = flaky_app.app


@attrs.frozen
class Env:
    cfg: CqrsConfig
    topics: AppTopics
    config_file: Path
    retrier: Retrier

    def cli(self, capsys: pytest.CaptureFixture[str], *args: str) -> str:
        capsys.readouterr()
        assert main(["--config", str(self.config_file), "dlq", *args]) == 0
        return capsys.readouterr().out


def letter(topics: AppTopics, name: str, offset: int, *, attempt: int = 1, transient: bool = True,
           final: bool = False, error_type: str = "ServiceUnavailable",
           age_s: float = 0.0) -> KafkaRecord:
    _, key, value, headers = encode_command(app, f"w-{name}", flaky_app.Charge(1, "/none"),
                                            command_id=f"cmd-{name}")
    dlq = [("stage", "handler"), ("error_type", error_type), ("error", "it broke"),
           ("topic", topics.commands), ("partition", "0"), ("offset", str(offset))]
    if transient:
        dlq += [("transient", "1"), ("attempt", str(attempt)), ("final", "1" if final else "0")]
    return KafkaRecord(topics.dead_letters, 0, offset, key, value,
                       [*headers, *((DLQ_PREFIX + k, v.encode()) for k, v in dlq)],
                       int((time.time() - age_s) * 1000))


@pytest.fixture
def env(cqrs_config: CqrsConfig, tmp_path: Path) -> Iterator[Env]:
    prefix = f"t-dlqops-{uuid.uuid4().hex[:8]}-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix})
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics, partitions=2)
    file = tmp_path / "cqrs.toml"
    file.write_text(
        f'[kafka]\nbootstrap_servers = "{cfg.kafka.bootstrap_servers}"\ntopic_prefix = "{prefix}"\n'
        f'[cassandra]\nhosts = "{cfg.cassandra.hosts}"\nport = {cfg.cassandra.port}\n'
        f'keyspace = "{cfg.cassandra.keyspace}"\n')
    retrier = Retrier(cfg, app, topics)
    # waiting (due in ~100 s), out of attempts (parked), not transient (left to operators)
    retrier.ingest([letter(topics, "wait", 0, age_s=-100), letter(topics, "last", 1, attempt=4,
                                                                   final=True, age_s=600),
                    letter(topics, "bug", 2, transient=False, error_type="KeyError", age_s=600)])
    yield Env(cfg, topics, file, retrier)
    retrier.close()


def test_list_shows_what_waits_with_counts_and_filters(env: Env,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = env.cli(capsys, "list", APP_REF)
    assert "cmd-wait" in out and "cmd-last" in out and "cmd-bug" in out
    assert "1 waiting, 2 parked, 0 done" in out
    rows = [json.loads(x) for x in env.cli(capsys, "list", APP_REF, "--state", "waiting",
                                           "--json").splitlines()]
    assert [(r["command_id"], r["state"], r["attempts"]) for r in rows] == [("cmd-wait", "waiting", 1)]
    by_error = env.cli(capsys, "list", APP_REF, "--error-type", "KeyError", "--json")
    assert [json.loads(x)["command_id"] for x in by_error.splitlines()] == ["cmd-bug"]
    old = env.cli(capsys, "list", APP_REF, "--older-than", "5m", "--json")
    assert sorted(json.loads(x)["command_id"] for x in old.splitlines()) == ["cmd-bug", "cmd-last"]
    parked = read_to_end(env.cfg, [env.topics.parked])
    assert [r.key for r in parked] == [b"w-last"]  # only the transient one out of attempts


def test_retry_of_a_parked_letter_sends_a_derived_id_and_shows_its_result(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    out = env.cli(capsys, "retry", APP_REF, "cmd-bug")
    new_id = out.split("sent again as ")[1].strip()
    assert new_id.startswith("cmd-bug~retry@")
    sent = [from_kafka(r.key, r.value, r.headers)[0] for r in read_to_end(env.cfg, [env.topics.commands])]
    assert [e.command_id for e in sent] == [new_id]
    assert "cmd-bug" not in env.cli(capsys, "list", APP_REF)  # done: no longer listed
    history = json.loads(env.cli(capsys, "show", APP_REF, "cmd-bug", "--json"))
    assert history["state"] == "done"
    assert [(h["state"], h["retry_command_id"], h["retry_outcome"]) for h in history["history"]] == [
        ("retried", new_id, "pending")]
    # the processor answers the retry: show finds the answer in the results topic
    result = CommandResult(new_id, ACCEPTED, "flaky.Wallet", "w-bug", 1, sent[0].timestamp, 0, 0, [])
    producer = make_producer(env.cfg)
    producer.produce(env.topics.results, key=new_id.encode(), value=app.codec.encode(result))
    assert producer.flush(30) == 0
    history = json.loads(env.cli(capsys, "show", APP_REF, "cmd-bug", "--json"))
    assert history["history"][0]["retry_outcome"] == "accepted"
    assert "cmd-bug" in env.cli(capsys, "show", APP_REF, "cmd-bug")  # the text form


def test_retry_of_a_waiting_letter_makes_it_due_now_and_park_stops_it(
        env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    assert env.retrier.deliver_due().delivered == 0  # due in ~100 s
    assert "due now" in env.cli(capsys, "retry", APP_REF, "cmd-wait")
    time.sleep(1.2)
    assert env.retrier.deliver_due().delivered == 1
    history = json.loads(env.cli(capsys, "show", APP_REF, "cmd-wait", "--json"))
    assert history["history"][0]["state"] == "delivered"
    # a new waiting letter (attempt 2 failed too), parked by the operator
    env.retrier.ingest([letter(env.topics, "wait", 3, attempt=2, age_s=-100)])
    assert "cmd-wait: parked" in env.cli(capsys, "park", APP_REF, "cmd-wait")
    time.sleep(0.1)
    rows = [json.loads(x) for x in env.cli(capsys, "list", APP_REF, "--json").splitlines()]
    assert ("cmd-wait", "parked", 2) in [(r["command_id"], r["state"], r["attempts"]) for r in rows]
    history = json.loads(env.cli(capsys, "show", APP_REF, "cmd-wait", "--json"))
    assert [h["retry_outcome"] for h in history["history"]] == ["failed again", "parked"]


def test_purge_forgets_done_letters(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    env.cli(capsys, "retry", APP_REF, "cmd-last")
    assert "1 letter(s) purged" in env.cli(capsys, "purge", APP_REF)  # default: --state done
    assert "0 waiting" not in env.cli(capsys, "list", APP_REF, "--state", "all")
    assert "cmd-last" not in env.cli(capsys, "list", APP_REF, "--state", "all")


def test_the_same_over_http(env: Env) -> None:
    from fastapi.testclient import TestClient

    from cqrs.http.app import create_http_app
    from cqrs.http.context import HttpContext

    with TestClient(create_http_app(HttpContext(app, env.cfg))) as http:
        listing = http.get("/dead-letters").json()
        assert listing["counts"] == {"waiting": 1, "parked": 2, "done": 0}
        waiting = http.get("/dead-letters", params={"state": "waiting"}).json()["letters"]
        assert [r["command_id"] for r in waiting] == ["cmd-wait"]
        assert http.get("/dead-letters", params={"state": "gone"}).status_code in (400, 422)
        shown = http.get("/dead-letters/cmd-last").json()
        assert [h["retry_outcome"] for h in shown["history"]] == ["parked"]
        assert http.get("/dead-letters/nope").status_code == 404
        parked = http.post("/dead-letters/cmd-wait/park").json()
        assert parked["result"] == "cmd-wait: parked"
        assert http.post("/dead-letters/nope/retry").status_code == 404
        assert http.delete("/dead-letters/cmd-wait").json()["purged"] == 1
        assert http.get("/dead-letters").json()["counts"] == {"waiting": 0, "parked": 2, "done": 0}
