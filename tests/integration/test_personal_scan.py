"""Every byte the stack keeps of an app, scanned for personal data (#26): ``cqrs run app`` of the
ticketing example (its read model holds the customer's name as a personal column), orders of
three customers with distinctive names and e-mails, then

- the raw bytes of every topic of the app (every partition from the beginning: keys, values,
  headers), every row of every table of its keyspace (every cell stringified, blobs as bytes),
  the Spark checkpoints and the runner's log hold none of the names and e-mails, before and
  after forgetting: only ciphertext is ever written;
- ``cqrs forget`` SIGKILLed between deleting the key and rewriting the read model (a test hook
  pauses it there), run again: it says it resumes, rewrites the read-model row and finishes;
  the forgotten customer's personal column holds the replacement (not even the ciphertext
  under the deleted key), the other customers read back unchanged;
- ``cqrs rebuild`` of the read model after forgetting equals the live generation, row for row,
  raw.

One ``cqrs run app`` for the module (the fixture of test_personal_data_on_the_stack.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cqrs.cli.main import main
from cqrs.client import CommandClient, StateReader
from cqrs.domain import FORGOTTEN
from cqrs.kafka_io import make_consumer, read_to_end
from cqrs.personal import SEALED_PREFIX
from cqrs.personal.forgetting import FORGET_TABLE, PAUSE_ENV
from domain_examples.ticketing import PlaceTicketOrder, TicketOrders, app
from projections.personal import stack_store
from projections.query import ProjectionReader
from projections.store import table_base
from projections.stores import open_store
from test_personal_data_on_the_stack import (  # noqa: F401 - the module's stack fixture
    APP_REF, CONSOLE_SCRIPT, START_WAIT, WAIT, Running, _rows_holding, running,
)

CUSTOMERS = [("c-zed", "Zephyrine Oakhollow", "zephyrine.oakhollow@example.org"),
             ("c-yara", "Yarrowmere Tillingdon", "yarrow.tillingdon@example.org"),
             ("c-xan", "Xanthippe Brackenbury", "xanthippe.b@example.org")]
FORGOTTEN_ONE = CUSTOMERS[0]


def _secrets() -> list[bytes]:
    return [t.encode() for _, name, mail in CUSTOMERS for t in (name, mail)]


def _topic_bytes(running: Running) -> tuple[list[str], int, bytes]:
    """Every topic of the app (its prefix), and the bytes of every record of them."""
    prefix = running.cfg.kafka.topic_prefix
    consumer = make_consumer(running.cfg)
    try:
        topics = sorted(t for t in consumer.list_topics(timeout=10).topics if t.startswith(prefix))
    finally:
        consumer.close()
    records = read_to_end(running.cfg, topics)
    raw = b"".join((r.key or b"") + (r.value or b"") + b"".join(
        k.encode() + (v or b"") for k, v in r.headers) for r in records)
    return topics, len(records), raw


def _file_hits(folder: Path, secrets: list[bytes]) -> tuple[int, list[str]]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), [f"{p}: {s!r}" for p in files for s in secrets if s in p.read_bytes()]


def _scan(running: Running) -> dict[str, Any]:
    """Where the stack's bytes hold a name or an e-mail (every list empty: nowhere)."""
    topics, records, raw = _topic_bytes(running)
    rows, table_hits = _rows_holding(running.session, running.cfg.cassandra.keyspace, _secrets())
    files, file_hits = _file_hits(running.log.parent, _secrets())  # checkpoints, runner log
    return {"topics": len(topics), "records": records, "rows": rows, "files": files,
            "topic_hits": [s for s in _secrets() if s in raw], "table_hits": table_hits,
            "file_hits": file_hits}


def _raw_views(generation: int, running: Running) -> list[Any]:
    store = open_store(running.cfg)  # not wrapped: the rows as stored
    try:
        return list(store.scan_views(TicketOrders(), table_base(app.name, "ticket_orders"),
                                     generation))
    finally:
        store.close()


def test_no_byte_of_the_stack_holds_personal_data_and_a_killed_forget_completes(
        running: Running, spark: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    cfg, session, keyspace = running.cfg, running.session, running.cfg.cassandra.keyspace
    running.until("the runner's key table", lambda: list(session.execute(
        "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s AND "
        "table_name = 'cqrs_forgotten_subjects'", (keyspace,))), START_WAIT)
    with CommandClient(app, cfg) as client:
        futures = [client.send(f"order-{cid}", PlaceTicketOrder(cid, name, mail, "Tosca", 3),
                               expected_version=0) for cid, name, mail in CUSTOMERS]
        assert [f.result(START_WAIT).status for f in futures] == ["accepted"] * 3
    store = stack_store(open_store(cfg), cfg, app)
    reader = ProjectionReader(app, store, generation_ttl=0.0)

    def all_projected() -> list[Any] | None:
        try:
            views = [reader.get("ticket_orders", f"order-{c}") for c, _, _ in CUSTOMERS]
        except Exception:  # no generation yet
            return None
        return views if all(views) else None

    before = running.until("the read model holds the three orders", all_projected)
    assert [(v["customer_id"], v["customer_name"]) for v in before] == [
        (c, name) for c, name, _ in CUSTOMERS]  # opened for the reader

    scanned = _scan(running)
    assert scanned["topic_hits"] == scanned["table_hits"] == scanned["file_hits"] == [], scanned
    # it scanned something: commands, events, results, schemas...; states, keys, views...
    assert scanned["topics"] >= 4 and scanned["records"] >= 9 and scanned["rows"] >= 12, scanned
    assert scanned["files"] >= 5, scanned

    # forget, killed after the key is deleted, before the read model is rewritten
    subject = FORGOTTEN_ONE[0]
    killed = subprocess.Popen([sys.executable, "-c", CONSOLE_SCRIPT, "forget", APP_REF, subject],
                              env={**running.env, PAUSE_ENV: "key"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    said: list[str] = []
    assert killed.stdout is not None
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and not any("pausing after key" in s for s in said):
        line = killed.stdout.readline()
        assert line, f"cqrs forget ended before pausing: {said}"
        said.append(line.rstrip())
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(30) == -signal.SIGKILL
    assert "  key deleted" in said, said
    status = session.execute(f"SELECT status, key_deleted FROM {keyspace}.{FORGET_TABLE} "
                             "WHERE subject = %s", (subject,)).one()
    assert tuple(status) == ("key_deleted", True)
    raw = dict(_raw_views(1, running))
    assert raw[f"order-{subject}"].values["customer_name"].startswith(SEALED_PREFIX)  # not yet

    again = running.cli("forget", APP_REF, subject)
    assert (again.returncode, again.stderr) == (0, ""), again
    lines = again.stdout.splitlines()
    assert lines[0].startswith(f"  resuming the forget of {subject!r} requested at "), lines
    assert "  key deleted before, by the run that stopped" in lines, lines
    assert f"  read model 'ticket_orders' generation 1: 1 row(s) of {subject!r} rewritten " \
           "(3 scanned)" in lines, lines
    assert lines[-1] == (f"finished forgetting data subject {subject!r} of app 'ticketing': the "
                         "run that stopped had deleted their key; 1 read-model row(s) rewritten")
    assert tuple(session.execute(f"SELECT status FROM {keyspace}.{FORGET_TABLE} WHERE subject "
                                 "= %s", (subject,)).one()) == ("done",)

    live = _raw_views(1, running)
    zed = dict(live)[f"order-{subject}"]
    assert zed.values["customer_name"] == FORGOTTEN  # rewritten: not even the ciphertext
    assert {k: v for k, v in live if k != f"order-{subject}"} == {
        k: v for k, v in raw.items() if k != f"order-{subject}"}  # the others untouched
    after = [reader.get("ticket_orders", f"order-{c}") for c, _, _ in CUSTOMERS]
    assert after[0] == {**before[0], "customer_name": FORGOTTEN}
    assert after[1:] == before[1:]
    with StateReader(app, cfg) as states:
        state = states.get(f"order-{subject}")
        assert state is not None and (state.state.customer_name, state.state.email) == (
            FORGOTTEN, FORGOTTEN)
        other = states.get(f"order-{CUSTOMERS[1][0]}")
        assert other is not None and other.state.email == CUSTOMERS[1][2]

    scanned = _scan(running)
    assert scanned["topic_hits"] == scanned["table_hits"] == scanned["file_hits"] == [], scanned

    # a rebuild after forgetting equals the live read model, raw: `cqrs rebuild` in this process,
    # on the session's Spark (as a process of its own it only added a JVM's start, ~12 s)
    for name, value in running.env.items():
        if name.startswith("CQRS_"):
            monkeypatch.setenv(name, value)
    capsys.readouterr()
    code = main(["rebuild", APP_REF, "ticket_orders", "--keep-old"])
    said = capsys.readouterr()
    assert code == 0, said.out[-3000:] + said.err[-3000:]
    assert "switched readers of 'ticket_orders' to generation 2" in said.out, said.out
    assert _raw_views(2, running) == live
    assert [reader.get("ticket_orders", f"order-{c}") for c, _, _ in CUSTOMERS] == after
    store.close()
