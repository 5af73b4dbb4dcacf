"""The in-process runner behaves like the real stack: one random command sequence (several
aggregates, two process managers, a handler that fails and then succeeds on a retry, stale
expected versions, a repeated command id) fed to :class:`cqrs.testing.runner.LocalRunner` and to
``cqrs run app`` on real Kafka, Spark and Cassandra, with the same command ids and times. Both
must give the same answers, the same events byte for byte (key, value and headers, as the
codec wrote them), the same dead letters, aggregate states and read models. The runner's status
shows the retry job as a query of its driver, with a retry delivered per transient failure.

Each command is sent once the previous one's work is done on both sides (its answer and every
answer it set off, through the process managers and the retry job), so the outcome does not
depend on how the real jobs' threads interleave. One difference is allowed, and checked apart:
when one event sets off two commands to the same partition (a refused loan slot: ``lending``
cancels the loan, ``strikes`` may suspend the member), the two process managers may write them
in either order, so an answer's ``source_offset`` is compared as a set per partition.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.client.encoding import encode_command
from cqrs.config import CqrsConfig
from cqrs.deadletters import parse_dead_letter
from cqrs.kafka_io import KafkaRecord, make_producer, read_to_end, take
from cqrs.processor.state import StateReader
from cqrs.results import CommandResult
from cqrs.testing.runner import LocalRunner
from cqrs.topics import AppTopics, ensure_topics, topics_for
from domain_examples.lending import AddBook, RegisterMember, RequestLoan, ReturnBook
from projections import LocalReadModels, ProjectionReader
from projections.stores import cached_store

APPS = Path(__file__).parent / "apps"
sys.path.insert(0, str(APPS))
import flaky_app  # noqa: E402
import parity_app  # noqa: E402
from ports import free_port  # noqa: E402
from waiting import topic_from_start  # noqa: E402
from flaky_app import ServiceUnavailable  # noqa: E402
from parity_app import app  # noqa: E402

APP_REF = "parity_app:app"
SEED = 20261126
MEMBERS = ["m-0", "m-1"]
BOOKS = [f"b-{i}" for i in range(7)]
WALLETS = ["w-0", "w-1"]
START_WAIT = 300.0  # a Spark driver and its queries on a shared 2-core box
STEP_WAIT = 60.0


@attrs.frozen
class Op:
    """One command of the sequence; ``fails`` is how many calls of the flaky service fail."""

    aggregate_id: str
    command: object
    command_id: str
    expected_version: int | None = None
    fails: int = 0


def sequence(rng: random.Random, tmp: Path, n: int = 60) -> list[Op]:
    """Members and books first, then ``n`` random loans, returns and charges."""
    ops = [Op(m, RegisterMember(m.upper()), f"reg-{m}") for m in MEMBERS]
    ops += [Op(b, AddBook(f"title {b}"), f"add-{b}") for b in BOOKS]
    for i in range(n):
        kind = rng.choice(["loan", "loan", "loan", "return", "charge", "charge", "stale", "again"])
        cid = f"op-{i}"
        if kind == "loan":
            ops.append(Op(rng.choice(BOOKS), RequestLoan(rng.choice([*MEMBERS, MEMBERS[0]])), cid))
        elif kind == "return":
            ops.append(Op(rng.choice(BOOKS), ReturnBook(), cid))
        elif kind == "charge":
            fails = rng.choice([0, 0, 1, 2])
            flag = str(tmp / f"flag-{i}")
            ops.append(Op(rng.choice(WALLETS), flaky_app.Charge(rng.randint(1, 99), flag), cid,
                          fails=fails))
        elif kind == "stale":  # the wallet exists by now or not: accepted once, then stale
            ops.append(Op(rng.choice(WALLETS), flaky_app.Charge(7, str(tmp / "no-flag")), cid,
                          expected_version=0))
        else:  # a repeated command id: answered again, applied once
            earlier = rng.choice([o for o in ops if o.command_id.startswith("op-")] or ops)
            ops.append(earlier)
    return ops


def set_flags(ops: list[Op]) -> None:
    for op in ops:
        if isinstance(op.command, flaky_app.Charge) and op.command_id.startswith("op-"):
            path = Path(op.command.flag)
            path.write_text(str(op.fails))
            path.with_suffix(".calls").unlink(missing_ok=True)


@attrs.frozen
class Outcome:
    """What one side did: every answer (in the order written, per command id), the events per
    aggregate as raw records, dead letters, states and read models."""

    answers: dict[str, list[CommandResult]]
    events: dict[tuple[str, str], list[tuple[bytes, bytes, list[tuple[str, bytes]]]]]
    dead_letters: Counter[tuple[str | None, int, str, str | None]]
    states: dict[str, Any]
    read_models: dict[str, Any]


def events_by_aggregate(records: list[KafkaRecord]) -> dict[tuple[str, str], list[Any]]:
    out: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for r in records:
        headers = [(k, v or b"") for k, v in r.headers or []]
        agg_type = dict(headers).get("cqrs.aggregate_type", b"").decode()
        out[(agg_type, (r.key or b"").decode())].append((r.key or b"", r.value or b"", headers))
    return dict(out)


def read_models_of(reader: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in MEMBERS:
        out[f"member_loans/{m}"] = reader.category("member_loans", m, page_size=50).items
    for w in WALLETS:
        out[f"wallet_totals/{w}"] = reader.get("wallet_totals", w)
    return out


@attrs.frozen
class Steps:
    """How the runner took the sequence: the time each command was sent at, and the answers
    (command id: how many) written by the end of each command's work."""

    times: list[dt.datetime]
    answered: list[Counter[str]]


def run_on_runner(ops: list[Op], start: dt.datetime, partitions: int) -> tuple[Outcome, Steps]:
    """The sequence through the in-process runner."""
    set_flags(ops)
    runner = LocalRunner(app, partitions=partitions, start=start, seed=SEED,
                         read_models=LocalReadModels(app))
    times, answered = [], []
    for op in ops:
        runner.advance(dt.timedelta(milliseconds=10))
        times.append(runner.clock)
        runner.send(op.aggregate_id, op.command, op.expected_version, op.command_id)
        runner.run()
        for _ in range(200):  # a transient failure waits for its backoff on the virtual clock
            if op.command_id in {a.command_id for a in runner.answers()}:
                break
            runner.advance(dt.timedelta(milliseconds=100))
        else:
            pytest.fail(f"the runner never answered {op}")
        answered.append(Counter(a.command_id for a in runner.answers()))
    answers: dict[str, list[CommandResult]] = defaultdict(list)
    for a in runner.answers():
        answers[a.command_id].append(a)
    kinds = {"lending.Member": MEMBERS, "lending.Book": BOOKS, "flaky.Wallet": WALLETS}
    states = {f"{t}/{i}": runner.state(i, t) for t, ids in kinds.items() for i in ids}
    letters = Counter((d.command_id, d.attempt, d.stage, d.error_type) for d in runner.dead_letters)
    return Outcome(dict(answers), events_by_aggregate(runner.event_records()), letters, states,
                   read_models_of(runner.read_model())), Steps(times, answered)


@attrs.frozen
class Stack:
    cfg: CqrsConfig
    topics: AppTopics
    tmp: Path
    log: Path
    status_url: str

    def tail(self) -> str:
        return self.log.read_text()[-6000:] if self.log.exists() else "(no log)"


@pytest.fixture(scope="module")
def stack(cqrs_config: CqrsConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from cqrs.cassandra_io import cql_cluster

    token = uuid.uuid4().hex[:8]
    prefix, keyspace = f"t-parity-{token}-", f"t_parity_{token}"
    tmp = tmp_path_factory.mktemp("parity")
    port = free_port()
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     cassandra={"keyspace": keyspace},
                                     spark={"checkpoint_dir": str(tmp / "checkpoints")})
    cluster = cql_cluster(cfg.cassandra.contact_points(), cfg.cassandra.port)
    session = cluster.connect()
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = {cfg.cassandra.replication}")
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), *sys.path]),
           "CQRS_CASSANDRA_KEYSPACE": keyspace, "CQRS_KAFKA_TOPIC_PREFIX": prefix,
           "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": cfg.spark.checkpoint_dir,
           "CQRS_RETRIER_INTERVAL": "0.2", "CQRS_RETRIER_TRIGGER": "300 milliseconds",
           "CQRS_METRICS_PORT": str(port)}
    log = tmp / "run_app.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", "run", "app", APP_REF,
                                 "--trigger", "300 milliseconds"],
                                env=env, stdout=sink, stderr=sink, cwd=tmp)
    s = Stack(cfg, topics, tmp, log, f"http://127.0.0.1:{port}/status.json")
    try:
        deadline = time.monotonic() + START_WAIT
        while True:
            try:
                with urllib.request.urlopen(s.status_url, timeout=5) as r:
                    queries = json.loads(r.read())["queries"]
                if len(queries) >= 7 and all(q["state"] == "active" for q in queries):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"cqrs run app did not start every job:\n{s.tail()}")
            time.sleep(0.25)
        yield s
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        cluster.shutdown()


def run_on_stack(stack: Stack, ops: list[Op], steps: Steps) -> Outcome:
    """The sequence on the real stack, each command encoded as the client encodes it (the same
    id and time as on the runner), the next one sent once every answer the runner gave by then
    is there too."""
    set_flags(ops)
    codec = app.codec
    producer = make_producer(stack.cfg)
    seen: Counter[str] = Counter()
    answers: dict[str, list[CommandResult]] = defaultdict(list)
    # one consumer on every partition of the results topic for the whole sequence: it hears an
    # answer as the broker has it (a read of the topic to its end every 50 ms, a consumer made
    # and closed each time, heard it up to ~0.1 s later and kept a core busier meanwhile)
    results = topic_from_start(stack.cfg, stack.topics.results)
    try:
        for n, (op, when, want) in enumerate(zip(ops, steps.times, steps.answered, strict=True)):
            _, key, value, headers = encode_command(app, op.aggregate_id, op.command,
                                                    expected_version=op.expected_version,
                                                    command_id=op.command_id, timestamp=when)
            producer.produce(stack.topics.commands, key=key, value=value, headers=headers)
            assert producer.flush(30) == 0
            deadline = time.monotonic() + (START_WAIT if n == 0 else STEP_WAIT)
            while any(seen[c] < k for c, k in want.items()):
                if time.monotonic() > deadline:
                    missing = {c: k - seen[c] for c, k in want.items() if seen[c] < k}
                    pytest.fail(f"the real stack did not answer {missing} after {op}:\n"
                                f"{stack.tail()}")
                for msg in take(results, 1000, 0.05):
                    if msg.error():
                        continue
                    result = codec.decode(msg.value())
                    seen[result.command_id] += 1
                    answers[result.command_id].append(result)
    finally:
        results.close()
    letters: Counter[tuple[str | None, int, str, str | None]] = Counter()
    for r in read_to_end(stack.cfg, [stack.topics.dead_letters]):
        d = parse_dead_letter(r)
        letters[(d.command_id, d.attempt, d.stage, d.error_type)] += 1
    with StateReader(app, stack.cfg, topics=stack.topics) as states_reader:
        states = {}
        for t, ids in {"lending.Member": MEMBERS, "lending.Book": BOOKS,
                       "flaky.Wallet": WALLETS}.items():
            for i in ids:
                found = states_reader.get(i, t)
                states[f"{t}/{i}"] = None if found is None else found.state
    return Outcome(dict(answers), events_by_aggregate(read_to_end(stack.cfg, [stack.topics.events])),
                   letters, states, {})


def without_offset(results: list[CommandResult]) -> list[CommandResult]:
    return [attrs.evolve(r, source_offset=-1) for r in results]


def offsets_per_partition(answers: dict[str, list[CommandResult]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for results in answers.values():
        for r in results:
            out[r.source_partition].append(r.source_offset)
    return {p: sorted(o) for p, o in out.items()}


def test_the_runner_and_the_real_stack_agree(stack: Stack) -> None:
    ops = sequence(random.Random(SEED), stack.tmp)
    start = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=5)
    local, steps = run_on_runner(ops, start, stack.cfg.kafka.default_partitions)

    # the sequence does what it is for (it is seeded: these hold for every run)
    firsts = [results[0] for results in local.answers.values()]
    assert any(len(results) > 1 for results in local.answers.values()), "no repeated command id"
    assert any(r.code == "wrong_expected_version" for r in firsts), "no stale expected version"
    assert any(d[1] >= 2 for d in local.dead_letters), "no command failed twice before it succeeded"
    assert all(r.status != "failed" for r in firsts), "a transient failure was not retried"
    cancelled = [k for k, v in local.events.items() if k[0] == "lending.Book" and any(
        b"LoanCancelled" in dict(h).get("cqrs.message_type", b"") for _, _, h in v)]
    assert cancelled, "no loan was refused by the member and cancelled at the book"
    assert sum(len(v) for v in local.events.values()) > 50

    real = run_on_stack(stack, ops, steps)

    assert set(real.answers) == set(local.answers)
    for cid, results in local.answers.items():
        assert without_offset(real.answers[cid]) == without_offset(results), cid
    assert offsets_per_partition(real.answers) == offsets_per_partition(local.answers)
    assert real.events.keys() == local.events.keys()
    for aggregate, records in local.events.items():
        assert real.events[aggregate] == records, f"the events of {aggregate} differ"
    assert real.dead_letters == local.dead_letters
    assert real.states == local.states

    reader = ProjectionReader(app, cached_store(stack.cfg))
    deadline = time.monotonic() + STEP_WAIT
    while (found := read_models_of(reader)) != local.read_models:
        if time.monotonic() > deadline:
            assert found == local.read_models, stack.tail()
        time.sleep(0.5)

    # `cqrs run app` ran the retry job as one more query of its driver (the app declares a
    # transient error): its status shows the retrier on the dead-letter topic, a retry delivered
    # for each transient failure, which the answers above show accepted on a later attempt (this
    # was test_retrier_run_app.py, with a `cqrs run app` of its own for one such failure)
    transient = sum(n for (_, _, _, error), n in real.dead_letters.items()
                    if error == ServiceUnavailable.__name__)
    assert transient >= 2, real.dead_letters
    deadline = time.monotonic() + 30  # the counters a round of the retrier later
    while True:
        with urllib.request.urlopen(stack.status_url, timeout=5) as r:
            status = json.loads(r.read())
        if status["counters"].get("retries_delivered", 0) >= transient or \
                time.monotonic() > deadline:
            break
        time.sleep(0.5)
    queries = {q["name"]: q for q in status["queries"]}
    assert {"processor", "retrier", "scheduler", "history"} <= set(queries), set(queries)
    assert queries["retrier"]["state"] == "active", queries["retrier"]
    assert queries["retrier"]["input_topic"] == stack.topics.dead_letters
    assert status["counters"].get("retries_delivered") == transient, status["counters"]
    assert status["counters"].get("letters_recorded", 0) >= transient, status["counters"]
