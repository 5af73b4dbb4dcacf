"""The command client, ``cqrs send`` and ``cqrs serve`` against a real processor on the real stack.

One processor query (the session's Spark) runs for the whole module on topics of its own; each
test uses aggregate ids of its own.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.client import (
    AsyncCommandClient,
    CommandClient,
    CommandTimeoutError,
    Outgoing,
    StateReader,
    UnknownCommandTypeError,
)
from cqrs.config import CqrsConfig
from cqrs.kafka_io import read_to_end, watermarks
from cqrs.processor.job import start_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.testing.example import Deposit, OpenAccount, Withdraw
from cqrs.testing.example_app import app
from cqrs.topics import AppTopics, topics_for
from ports import free_port

APP_REF = "cqrs.testing.example_app:app"
WAIT = 120.0  # generous: the processor's micro-batches take seconds on a shared 2-core box


@attrs.frozen
class Running:
    cfg: CqrsConfig
    topics: AppTopics
    checkpoint: str
    prefix: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                "CQRS_KAFKA_TOPIC_PREFIX": self.prefix,
                "CQRS_KAFKA_BOOTSTRAP": self.cfg.kafka.bootstrap_servers,
                "CQRS_SPARK_CHECKPOINT_DIR": self.cfg.spark.checkpoint_dir}


@pytest.fixture(scope="module")
def running(cqrs_config: CqrsConfig, spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    prefix = f"t-client-{uuid.uuid4().hex[:8]}-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix})
    topics = topics_for(app.name, prefix)
    checkpoint = str(tmp_path_factory.mktemp("client") / "processor")
    query = start_processor(spark, cfg, ProcessorOptions(APP_REF, topics=topics, checkpoint=checkpoint))
    try:
        yield Running(cfg, topics, checkpoint, prefix)
    finally:
        query.stop()


@pytest.fixture
def client(running: Running) -> Iterator[CommandClient]:
    with CommandClient(app, running.cfg) as c:
        yield c


def _acc() -> str:
    return f"acc-{uuid.uuid4().hex[:8]}"


def test_round_trip_accepted_rejected_and_versions(client: CommandClient) -> None:
    acc = _acc()
    opened = client.send_and_wait(acc, OpenAccount("ann"), expected_version=0, timeout=WAIT)
    assert (opened.status, opened.version, opened.aggregate_id) == ("accepted", 1, acc)
    assert len(opened.event_ids) == 1
    deposit = client.send(acc, Deposit(100), expected_version=1)
    too_much = client.send(acc, Withdraw(500))
    assert deposit.result(WAIT).version == 2
    r = too_much.result(WAIT)
    assert (r.status, r.code, r.version) == ("rejected", "insufficient_funds", 2)
    assert "insufficient funds" in (r.reason or "")
    stats = client.listener_stats()
    assert stats.partitions == (client.reply_partition,)  # reads only its own partition
    assert stats.records_matched == 3 and stats.records_read >= 3 and stats.pending == 0


def test_send_many_keeps_per_aggregate_order(client: CommandClient) -> None:
    acc = _acc()
    batch = [Outgoing(acc, OpenAccount("bob"))] + [
        Outgoing(acc, Deposit(i), expected_version=i) for i in range(1, 21)]
    results = [f.result(WAIT) for f in client.send_many(batch)]
    assert [r.status for r in results] == ["accepted"] * 21
    assert [r.version for r in results] == list(range(1, 22))


def test_async_client_round_trip(running: Running) -> None:
    acc = _acc()

    async def scenario() -> list[Any]:
        async with AsyncCommandClient(app, running.cfg) as client:
            opened = await client.send(acc, OpenAccount("cy"), timeout=WAIT)
            more = await client.send_many([Outgoing(acc, Deposit(5)), Outgoing(acc, Withdraw(99))],
                                          timeout=WAIT)
            return [opened, *more]

    opened, deposited, refused = asyncio.run(scenario())
    assert (opened.version, deposited.version) == (1, 2)
    assert (refused.status, refused.code) == ("rejected", "insufficient_funds")


def test_racing_clients_exactly_one_wins(running: Running, client: CommandClient) -> None:
    acc = _acc()
    assert client.send_and_wait(acc, OpenAccount("dee"), timeout=WAIT).version == 1
    with CommandClient(app, running.cfg) as other:
        a = client.send(acc, Deposit(1), expected_version=1)
        b = other.send(acc, Deposit(2), expected_version=1)
        ra, rb = a.result(WAIT), b.result(WAIT)
    assert sorted([ra.status, rb.status]) == ["accepted", "rejected"]
    loser = ra if ra.status == "rejected" else rb
    assert (loser.code, loser.version) == ("wrong_expected_version", 2)


def test_timed_out_send_resent_with_same_id_runs_once(running: Running, client: CommandClient) -> None:
    acc = _acc()
    client.send_and_wait(acc, OpenAccount("eve"), timeout=WAIT)
    with pytest.raises(CommandTimeoutError) as timed_out:
        # no wait at all: a serving processor answers within milliseconds
        client.send_and_wait(acc, Deposit(7), command_id=f"dep-{acc}", timeout=0)
    assert timed_out.value.command_id == f"dep-{acc}"
    assert isinstance(timed_out.value, TimeoutError)
    again = client.send_and_wait(acc, Deposit(7), command_id=timed_out.value.command_id, timeout=WAIT)
    assert (again.status, again.version) == ("accepted", 2)
    deposits = [e for e in read_to_end(running.cfg, [running.topics.events])
                if e.key == acc.encode() and dict(e.headers)["cqrs.message_type"] == b"example.bank.Deposited"]
    assert len(deposits) == 1  # one set of events for the two sends
    assert client.listener_stats().pending == 0


def test_bad_input_is_refused_before_kafka(client: CommandClient) -> None:
    with pytest.raises(UnknownCommandTypeError, match="known command types"):
        client.send("acc-x", object())
    with pytest.raises(ValueError, match="aggregate id"):
        client.send("", Deposit(1))
    with pytest.raises(ValueError, match="expected_version"):
        client.send("acc-x", Deposit(1), expected_version=-1)


def test_state_reader_returns_version_and_state(running: Running, client: CommandClient, spark: Any) -> None:
    acc = _acc()
    client.send_and_wait(acc, OpenAccount("fay"), timeout=WAIT)
    last = client.send_and_wait(acc, Deposit(30), timeout=WAIT)
    with StateReader(app, running.cfg, topics=running.topics) as reader:
        # the state row is written right after the result: wait for the version the result gave
        state = reader.get(acc, min_version=last.version, timeout=WAIT)
        assert state is not None and (state.version, state.state.balance) == (2, 30)
        assert reader.get("acc-never-seen") is None


# ---- CLI -------------------------------------------------------------------------------------


def _cli(running: Running, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cqrs.cli.main", *args], env=running.env(),
                          capture_output=True, text=True, timeout=300)


def test_cli_send_round_trip_and_errors(running: Running) -> None:
    acc = _acc()
    out = _cli(running, "send", APP_REF, "OpenAccount", acc, "--data", '{"owner": "gus"}',
               "--expect", "0", "--wait", "--timeout", str(WAIT))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["status"], result["version"], result["aggregate_id"]) == ("accepted", 1, acc)

    out = _cli(running, "send", APP_REF, "example.bank.Withdraw", acc, "--data", '{"amount": 5}',
               "--wait", "--timeout", str(WAIT), "--command-id", f"w-{acc}")
    assert out.returncode == 1  # rejected
    assert json.loads(out.stdout)["code"] == "insufficient_funds"

    out = _cli(running, "send", APP_REF, "Deposit", acc, "--data", '{"amount": 3}')
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == "sent"

    bad = _cli(running, "send", APP_REF, "Deposit", acc, "--data", '{"amount": "ten"}')
    assert bad.returncode == 2 and "field 'amount'" in bad.stderr and "Traceback" not in bad.stderr
    broken = _cli(running, "send", APP_REF, "Deposit", acc, "--data", '{"amount": ')
    assert broken.returncode == 2 and "not valid JSON" in broken.stderr
    unknown = _cli(running, "send", APP_REF, "Depositt", acc)
    assert unknown.returncode == 2 and "example.bank.Deposit" in unknown.stderr


# ---- HTTP ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(running: Running, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import httpx

    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cqrs.cli.main", "serve", APP_REF, "--port", str(port)],
            env=running.env(), stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail(f"cqrs serve did not start: {Path(log).read_text()}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_http_round_trip_and_state(server: str) -> None:
    import httpx

    acc = _acc()
    with httpx.Client(base_url=server, timeout=WAIT + 30) as http:
        r = http.post("/commands/OpenAccount", params={"timeout": WAIT},
                      json={"aggregate_id": acc, "data": {"owner": "hal"}, "expected_version": 0})
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["version"], r.json()["accepted"]) == ("accepted", 1, True)

        r = http.post("/commands/example.bank.Deposit", params={"wait": "false"},
                      json={"aggregate_id": acc, "data": {"amount": 12}, "command_id": f"d-{acc}"})
        assert r.status_code == 202 and r.json()["command_id"] == f"d-{acc}"
        r = http.get(r.json()["result_url"], params={"timeout": WAIT})
        assert (r.status_code, r.json()["version"]) == (200, 2)

        r = http.post("/commands/Deposit", params={"timeout": 0.001},  # gives up at once
                      json={"aggregate_id": acc, "data": {"amount": 0}, "command_id": f"z-{acc}"})
        assert r.status_code == 504 and r.json()["command_id"] == f"z-{acc}"
        r = http.get(r.json()["result_url"], params={"timeout": WAIT})  # the answer still comes
        assert (r.status_code, r.json()["code"], r.json()["version"]) == (200, "invalid_amount", 2)

        r = http.post("/commands/Withdraw", params={"timeout": WAIT},
                      json={"aggregate_id": acc, "data": {"amount": 1000}})
        assert r.status_code == 200 and r.json()["code"] == "insufficient_funds"

        r = http.get(f"/aggregates/{acc}", params={"version": 2, "timeout": WAIT})  # read-your-writes
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 2
        assert r.json()["state"]["balance"] == 12 and r.json()["aggregate_type"] == "example.bank.Account"
        assert http.get("/aggregates/acc-nobody").status_code == 404


def test_http_bad_requests_get_4xx_with_reasons(server: str) -> None:
    import httpx

    with httpx.Client(base_url=server, timeout=30) as http:
        r = http.post("/commands/Deposit", content=b'{"aggregate_id": "a", "data": {',
                      headers={"content-type": "application/json"})
        assert r.status_code == 422 and "JSON" in r.json()["message"]
        r = http.post("/commands/Deposit", json={"aggregate_id": "a", "data": {"amount": "x"}})
        assert (r.status_code, r.json()["field"]) == (422, "amount")
        r = http.post("/commands/Nope", json={"aggregate_id": "a", "data": {}})
        assert r.status_code == 404 and "example.bank.Deposit" in r.json()["message"]
        r = http.post("/commands/Deposit", json={"data": {"amount": 1}})
        assert r.status_code == 422 and "aggregate_id" in r.json()["message"]
        r = http.get("/commands/never-sent/result")
        assert r.status_code == 404
        commands = http.get("/commands").json()
        assert commands["example.bank.Deposit"]["fields"]["amount"]["required"] is True
        assert http.get("/openapi.json").status_code == 200


def test_results_of_other_clients_are_not_decoded(running: Running) -> None:
    """Clients pinned to one reply partition: each reads the other's records but matches only
    its own; a client on another partition reads none of them."""
    pin = running.cfg.with_overrides(client={"reply_partition": 0})
    away = running.cfg.with_overrides(client={"reply_partition": 1})
    with CommandClient(app, pin) as a, CommandClient(app, pin) as b, CommandClient(app, away) as c:
        before = watermarks(running.cfg, running.topics.results)[1][1]
        accs = [_acc() for _ in range(5)]
        fa = [a.send(x, OpenAccount("a")) for x in accs]
        fb = [b.send(x, Deposit(1)) for x in accs]
        for f in fa + fb:
            f.result(WAIT)
        time.sleep(2)
        sa, sb, sc = a.listener_stats(), b.listener_stats(), c.listener_stats()
        after = watermarks(running.cfg, running.topics.results)[1][1]
    assert (sa.records_matched, sb.records_matched) == (5, 5)
    assert sa.records_read >= 10 and sb.records_read >= 10  # they share partition 0
    assert sc.partitions == (1,) and sc.records_matched == 0
    assert sc.records_read <= after - before  # only partition 1 (other tests' stragglers)
    ours = {f.command_id for f in fa + fb}
    counts = collections.Counter(r.partition for r in read_to_end(running.cfg, [running.topics.results])
                                 if r.key and r.key.decode() in ours)
    assert counts == {0: 10}
