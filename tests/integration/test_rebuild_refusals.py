"""Rebuilds and projector starts that cannot destroy, on the real stack (issue #28, item 3).

Each test has topics and a keyspace of its own holding a few accounts of the example bank
(``projections.testing:app``) whose ``balances`` are at generation 1, folded by the projection
code without Spark (what the projector would have written). Then:

- a release that renamed ``Deposited.amount`` (``renamed_field_bank_app``: no default, no
  upcaster) is refused by ``cqrs rebuild`` (exit 2, the field named, nothing created: readers
  stay on generation 1 and answer the old balances), by ``cqrs run projector``, and by
  ``cqrs run app``'s supervisor, which marks the processor and the projector ``refused`` and
  does not restart them;
- an event no release can read (not Avro) makes the rebuild dead-letter it: ``cqrs rebuild``
  exits 2 saying how many and what to do, readers stay on generation 1, which is not dropped;
  ``allow_dead_letters=True`` switches anyway.

Only the dead-letter test runs Spark jobs; the refusals happen before any query starts.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import attrs
import pytest

from cqrs.cli.main import main
from cqrs.config import CqrsConfig, load_config
from cqrs.kafka_io import make_producer, read_to_end
from cqrs.testing.example import AccountOpened, Deposited
from cqrs.topics import AppTopics, ensure_topics, topics_for
from projections import ProjectionReader
from projections.dlq import dead_letter_topic, read_dead_letters
from projections.errors import GenerationError
from projections.local import LocalProjector
from projections.rebuild import rebuild_projection
from projections.records import Generations, event_record
from projections.store import ProjectionStore, table_base
from projections.stores import cached_store
from projections.testing import app, produce_events, publish_schemas

sys.path.insert(0, str(Path(__file__).parent / "apps"))
from waiting import wait_for  # noqa: E402

APP_REF = "projections.testing:app"
RENAMED = "renamed_field_bank_app:app"  # imported by the driver only: it is refused before Spark
BASE = table_base(app.name, "balances")
BALANCES = {"acc-1": 30, "acc-2": 7}
FIELD = re.compile(r"example\.bank\.Deposited\.cents: new field without a default")


@attrs.define
class Log:
    cfg: CqrsConfig
    topics: AppTopics
    store: ProjectionStore

    def reader(self) -> ProjectionReader:
        return ProjectionReader(app, self.store, generation_ttl=0)

    def balances(self) -> dict[str, int]:
        reader = self.reader()
        return {acc: reader.get("balances", acc)["balance"] for acc in BALANCES}  # type: ignore[index]


@pytest.fixture
def log(unique_name: str, unique_keyspace: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, cqrs_config: CqrsConfig) -> Log:
    """The bank's accounts on topics and a keyspace of their own, ``balances`` at generation 1;
    the configuration in the environment too, for ``cqrs`` commands run in this process."""
    monkeypatch.setenv("CQRS_KAFKA_TOPIC_PREFIX", unique_name + "-")
    monkeypatch.setenv("CQRS_CASSANDRA_KEYSPACE", unique_keyspace)
    monkeypatch.setenv("CQRS_SPARK_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("CQRS_PROJECTIONS_DROP_GRACE", "0.5")
    monkeypatch.setenv("CQRS_METRICS_PORT", "0")  # cqrs run app: no status server
    monkeypatch.setenv("CQRS_METRICS_RESTART_BACKOFF", "0.2")
    cfg = load_config()
    topics = topics_for(app.name, cfg.kafka.topic_prefix)
    ensure_topics(cfg, topics)
    publish_schemas(cfg, topics, app)
    produce_events(cfg, topics.events, app, [
        ("acc-1", AccountOpened("ann")), ("acc-1", Deposited(10)), ("acc-1", Deposited(20)),
        ("acc-2", AccountOpened("bob")), ("acc-2", Deposited(7)),
    ], versions={})
    store = cached_store(cfg)
    LocalProjector(app, store, ["balances"]).apply(
        event_record(r.key, r.value, r.headers, r.partition, r.offset)
        for r in read_to_end(cfg, [topics.events]))
    found = Log(cfg, topics, store)
    assert found.balances() == BALANCES
    return found


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_rebuild_of_an_incompatible_release_is_refused_and_readers_keep_the_good_one(
        log: Log, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, said = _run(capsys, "rebuild", RENAMED, "balances")
    assert code == 2, said
    assert "not rebuilding example-bank/balances (readers stay on generation 1)" in said, said
    assert FIELD.search(said), said
    assert log.store.generations(BASE) == Generations(1, None)  # no generation 2 begun
    assert log.balances() == BALANCES


def test_a_projector_of_an_incompatible_release_is_refused_at_start(
        log: Log, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code, said = _run(capsys, "run", "projector", RENAMED, "--available-now")
    assert code == 2, said
    assert "the projector of example-bank/balances cannot start" in said, said
    assert FIELD.search(said), said
    assert not [q for q in spark.streams.active if "example-bank" in (q.name or "")]
    assert log.balances() == BALANCES


def test_run_app_refuses_an_incompatible_release_instead_of_restarting_it(
        log: Log, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from cqrs.cli.app_cmd import build_runner
    from cqrs.ops import listener

    attached: list[Any] = []
    attach = listener.attach_listener
    monkeypatch.setattr(listener, "attach_listener",
                        lambda s, board: attached.append(attach(s, board)) or attached[-1])
    said: list[str] = []
    runner = build_runner(log.cfg, RENAMED, retrier=False, process_managers=False,
                          scheduler=False, history=False, report=said.append)
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    thread.start()

    def queries() -> dict[str, Any]:
        return {q["name"]: q for q in runner.board.snapshot()["queries"]}

    try:
        wait_for("both queries refused",
                 lambda: {q["state"] for q in queries().values()} == {"refused"},
                 log=lambda: "\n".join(said))
        time.sleep(2.0)  # ten back-offs of 0.2 s: a restarting query would have been retried
        found = queries()
        assert set(found) == {"processor", "projector:balances"}
        for q in found.values():
            assert (q["state"], q["restarts"], q["id"]) == ("refused", 0, ""), q
            assert q["last_error"].startswith("incompatible schema: "), q
            assert FIELD.search(q["last_error"]), q
        assert "the projector of example-bank/balances cannot start" in \
            found["projector:balances"]["last_error"]
        assert sum("not restarted" in m for m in said) == 2, said
        assert not any("restart 1 in" in m for m in said), said
    finally:
        stop.set()
        thread.join(60)
        for it in attached:
            spark.streams.removeListener(it)
    assert not thread.is_alive()
    assert log.balances() == BALANCES


def test_a_rebuild_that_dead_letters_does_not_switch_unless_allowed(
        log: Log, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    opened = next(r for r in read_to_end(log.cfg, [log.topics.events]) if r.key == b"acc-1")
    producer = make_producer(log.cfg)  # version 1 of another account, its value not Avro
    producer.produce(log.topics.events, key=b"acc-corrupt", value=b"not an Avro message",
                     headers=opened.headers)
    assert producer.flush(30) == 0

    code, said = _run(capsys, "rebuild", APP_REF, "balances")
    assert code == 2, said
    assert ("the rebuild of example-bank/balances dead-lettered 1 of 6 events into generation 2, "
            "so it did not switch: readers stay on generation 1 and it was not dropped") in said, said
    assert f"cqrs projections dlq {APP_REF} list --projection balances" in said, said
    assert f"cqrs rebuild {APP_REF} balances --force --allow-dead-letters" in said, said
    assert log.store.generations(BASE) == Generations(1, 2)
    assert log.balances() == BALANCES  # generation 1, whole
    letters = read_dead_letters(log.cfg, dead_letter_topic(app.name, log.cfg.kafka.topic_prefix))
    assert [(e.projection, e.letter.record.aggregate_id) for e in letters] == [
        ("balances", "acc-corrupt")]  # written although no projector had made the topic

    with pytest.raises(GenerationError, match="pass --force"):  # generation 2 stays recorded
        rebuild_projection(spark, log.cfg, APP_REF, "balances", report=lambda _: None)
    report = rebuild_projection(spark, log.cfg, APP_REF, "balances", force=True,
                                allow_dead_letters=True, report=lambda _: None)
    assert (report.old_generation, report.new_generation, report.dead_letters) == (1, 3, 1)
    assert report.dropped_old
    assert log.store.generations(BASE) == Generations(3, None)
    assert log.balances() == BALANCES
