"""Process managers on the real stack: the lending example's processor and both of its process
managers run as `cqrs run` processes. Racing clients cannot get a member past three loans; a
client waits for each loan's conversation to end; a process manager killed with SIGKILL and
restarted, then one replayed from the start of the log, add no second effect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.client import CommandClient, StateReader
from cqrs.config import CqrsConfig
from cqrs.envelope import from_kafka
from cqrs.kafka_io import read_to_end, watermarks
from cqrs.topics import AppTopics, ensure_topics, topics_for
from domain_examples.lending import (
    MAX_LOANS, AddBook, BookLent, LoanCancelled, RegisterMember, RequestLoan, ReturnBook, app,
)
from process_group import Jobs
from waiting import wait_for

APP_REF = "domain_examples.lending:app"


@attrs.define
class Stack:
    cfg: CqrsConfig
    topics: AppTopics
    tmp: Path
    env: dict[str, str]
    client: CommandClient
    jobs: Jobs

    def start_pm(self, name: str, *extra: str) -> None:
        self.jobs.run(name, "run", "process-manager", APP_REF, name, "--max-events-per-trigger",
                      "500", *extra)

    def events(self) -> list[tuple[Any, Any]]:
        out = []
        for r in read_to_end(self.cfg, [self.topics.events]):
            env, payload = from_kafka(r.key, r.value, r.headers)
            out.append((env, app.codec.decode(payload)))
        return out


@pytest.fixture(scope="module")
def stack(cqrs_config: CqrsConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("pm")
    prefix = f"t-pm-{uuid.uuid4().hex[:8]}-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     spark={"checkpoint_dir": str(tmp / "ck")})
    topics = topics_for(app.name, prefix)
    ensure_topics(cfg, topics)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "CQRS_KAFKA_TOPIC_PREFIX": prefix, "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": str(tmp / "ck"), "CQRS_METRICS_PORT": "0"}
    s = Stack(cfg, topics, tmp, env, CommandClient(app, cfg), Jobs(tmp, env))
    s.jobs.run("processor", "run", "processor", APP_REF, "--trigger", "300 milliseconds")
    s.start_pm("lending")
    s.start_pm("strikes")
    try:
        first = s.client.send_and_wait("ann", RegisterMember("Ann"), timeout=420)
        assert first.status == "accepted", s.jobs.log("processor")
        yield s
    finally:
        s.client.close()
        s.jobs.stop_all()


def _ends(s: Stack, topic: str) -> dict[int, int]:
    """The next offset of each partition of ``topic``."""
    return {p: high for p, (_, high) in watermarks(s.cfg, topic).items()}


def _command_ids(s: Stack, after: dict[int, int]) -> Counter[str]:
    """The command ids of the commands topic's records at or past ``after``, counted."""
    return Counter(from_kafka(r.key, r.value, r.headers)[0].command_id
                   for r in read_to_end(s.cfg, [s.topics.commands])
                   if r.offset >= after.get(r.partition, 0))


def _answered_ids(s: Stack, after: dict[int, int]) -> Counter[str]:
    """The command ids the results topic answered at or past ``after`` (results are keyed by
    command id), counted."""
    return Counter((r.key or b"").decode() for r in read_to_end(s.cfg, [s.topics.results])
                   if r.offset >= after.get(r.partition, 0))


def _loan_effects(s: Stack, member: str) -> Counter[str]:
    """What the loan conversations did to one member and the books: event types counted."""
    seen: Counter[str] = Counter()
    for env, ev in s.events():
        if env.aggregate_id == member or getattr(ev, "member_id", None) == member:
            seen[type(ev).__name__] += 1
    return seen


def test_racing_clients_never_get_a_member_past_the_limit_and_each_waits_for_its_loan(
        stack: Stack) -> None:
    s = stack
    books = [f"bk-{i}" for i in range(MAX_LOANS + 3)]
    for b in books:
        assert s.client.send_and_wait(b, AddBook(f"title {b}"), timeout=120).accepted

    def borrow(book: str) -> tuple[str, Any]:
        with CommandClient(app, s.cfg) as client:  # one client per racer
            result = client.send_and_wait(book, RequestLoan("ann"), timeout=120)
            assert result.accepted, result
            _, event = client.wait_conversation(result.command_id, timeout=180)
            return book, event

    with ThreadPoolExecutor(len(books)) as pool:
        outcomes = dict(pool.map(borrow, books))
    lent = [b for b, e in outcomes.items() if isinstance(e, BookLent)]
    cancelled = [b for b, e in outcomes.items() if isinstance(e, LoanCancelled)]
    assert len(lent) == MAX_LOANS and len(cancelled) == len(books) - MAX_LOANS, outcomes
    assert all(e.reason == "limit_reached" for b, e in outcomes.items() if b in cancelled)
    # a returned book frees a slot again
    assert s.client.send_and_wait(lent[0], ReturnBook(), timeout=60).accepted
    wait_for("the slot to be released", lambda: _loan_effects(s, "ann")["LoanSlotReleased"] == 1,
             timeout=120)


def test_three_refusals_in_a_row_suspend_a_member_through_the_stateful_process_manager(
        stack: Stack) -> None:
    s = stack
    assert s.client.send_and_wait("cy", RegisterMember("Cy"), timeout=60).accepted
    books = [f"cy-{i}" for i in range(MAX_LOANS + 3)]
    for b in books:
        assert s.client.send_and_wait(b, AddBook(b), timeout=60).accepted
    ends = []
    for b in books:  # one after the other: three loans, then three refusals in a row
        started = s.client.send_and_wait(b, RequestLoan("cy"), timeout=60)
        ends.append(type(s.client.wait_conversation(started.command_id, timeout=180)[1]).__name__)
    assert ends == ["BookLent"] * MAX_LOANS + ["LoanCancelled"] * 3
    # the same wait over HTTP and from the command line, for the last conversation
    from fastapi.testclient import TestClient

    from cqrs.http.app import create_http_app
    from cqrs.http.context import HttpContext

    with TestClient(create_http_app(HttpContext(app, s.cfg))) as http:
        body = http.get(f"/conversations/{started.command_id}", params={"timeout": 30}).json()
        assert body["event"] == {"type": "lending.LoanCancelled",
                                 "data": {"member_id": "cy", "reason": "limit_reached"}}, body
        assert http.get("/conversations/no-such-conversation",
                        params={"timeout": 1}).status_code == 504
    cli = subprocess.run([sys.executable, "-m", "cqrs.cli.main", "conversation", "wait", APP_REF,
                          started.command_id, "--timeout", "30"],
                         env=s.env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "lending.LoanCancelled of lending.Book" in cli.stdout, cli
    wait_for("cy to be suspended", lambda: _loan_effects(s, "cy")["MemberSuspended"] == 1,
             timeout=120)
    with StateReader(app, s.cfg) as reader:
        found = reader.get("cy", "lending.Member")
    assert found is not None and found.state.suspended and len(found.state.loans) == MAX_LOANS


def test_a_killed_then_replayed_process_manager_adds_no_second_effect(stack: Stack) -> None:
    s = stack
    assert s.client.send_and_wait("bob", RegisterMember("Bob"), timeout=60).accepted
    for b in ("bob-1", "bob-2"):
        assert s.client.send_and_wait(b, AddBook(b), timeout=60).accepted
    first = s.client.send_and_wait("bob-1", RequestLoan("bob"), timeout=60)
    s.jobs.kill("lending")  # SIGKILL, wherever it was
    second = s.client.send_and_wait("bob-2", RequestLoan("bob"), timeout=60)
    s.start_pm("lending")
    for cid in (first.command_id, second.command_id):
        _, ev = s.client.wait_conversation(cid, timeout=240)
        assert isinstance(ev, BookLent), s.jobs.log("lending")
    before = _loan_effects(s, "bob")
    assert (before["LoanSlotReserved"], before["BookLent"]) == (2, 2), before

    # replay the whole log: every command is sent again and recognised; nothing changes
    s.jobs.kill("lending", signal.SIGTERM)
    log_size = len(s.events())
    commands_before, results_before = _ends(s, s.topics.commands), _ends(s, s.topics.results)
    proc = s.jobs.run("lending-replay", "run", "process-manager", APP_REF, "lending", "--replay",
                      "--available-now")
    assert proc.wait(600) == 0, s.jobs.log("lending-replay")
    assert "commands=" in s.jobs.log("lending-replay")
    s.start_pm("lending")
    resent = _command_ids(s, commands_before)
    assert resent, "the replay sent no command"
    wait_for("the processor to answer every command the replay sent",  # each once more
             lambda: not resent - _answered_ids(s, results_before), timeout=120,
             log=lambda: s.jobs.log("processor"))
    after = _loan_effects(s, "bob")
    assert after == before, (before, after)
    assert len(s.events()) == log_size
