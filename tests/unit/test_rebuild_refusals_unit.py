"""The pure parts of "rebuilds that cannot destroy" (issue #28, item 3): the supervisor's decision
not to restart a query refused for an incompatible schema, the messages of a refused projector
and of a rebuild that dead-lettered events, and the CLI flag. The real stack:
tests/integration/test_rebuild_refusals.py."""

from __future__ import annotations

import uuid
from typing import Any

import attrs
import pytest

from cqrs.cli.main import build_parser
from cqrs.errors import IncompatibleSchemaError
from cqrs.ops.board import StatusBoard
from cqrs.ops.server import status_page
from cqrs.ops.supervisor import QuerySpec, Supervisor, refusal
from projections.errors import RebuildDeadLettersError

INCOMPATIBLE = IncompatibleSchemaError(
    "the current schemas cannot read stored data: add a default or register an upcaster (and "
    "raise the class version) for each of:\n  example.bank.Deposited.cents: new field without a "
    "default (type example.bank.Deposited v1, stored fingerprint 0123)")


@attrs.define
class _Query:
    """A started query's face, enough for the supervisor: ended with ``error`` unless active."""

    error: BaseException | None = None
    isActive: bool = True  # noqa: N815 - StreamingQuery's name
    id: str = attrs.Factory(lambda: str(uuid.uuid4()))
    runId: str = attrs.Factory(lambda: str(uuid.uuid4()))  # noqa: N815
    name: str = "q"

    def exception(self) -> BaseException | None:
        return self.error

    def stop(self) -> None:
        self.isActive = False


def _spec(name: str, starts: list[str], start: Any) -> QuerySpec:
    def counted(generation: int | None) -> Any:
        starts.append(name)
        return start()
    return QuerySpec(name, "projector", "bank.events", counted)


def _raise(error: BaseException) -> Any:
    def start() -> Any:
        raise error
    return start


def test_only_an_incompatible_schema_is_a_refusal() -> None:
    assert refusal(INCOMPATIBLE) == "incompatible schema"
    assert refusal(RuntimeError("Cassandra is down")) is None
    assert refusal(None) is None


def test_a_query_refused_for_an_incompatible_schema_is_not_restarted() -> None:
    board = StatusBoard("bank")
    starts: list[str] = []
    said: list[str] = []
    ended = _Query()
    specs = [_spec("refused-at-start", starts, _raise(INCOMPATIBLE)),
             _spec("flaky", starts, _raise(RuntimeError("Cassandra is down"))),
             _spec("refused-later", starts, lambda: ended)]
    supervisor = Supervisor(board, specs, backoff_s=0.0, report=said.append)
    for _ in range(4):
        supervisor.check()
        ended.isActive, ended.error = False, INCOMPATIBLE  # the thread's check failed later
    assert starts.count("refused-at-start") == 1 and starts.count("refused-later") == 1
    assert starts.count("flaky") == 4  # restarted after every back-off, as before
    found = {q["name"]: q for q in board.snapshot()["queries"]}
    for name in ("refused-at-start", "refused-later"):
        q = found[name]
        assert (q["state"], q["restarts"]) == ("refused", 0), q
        assert q["last_error"].startswith("incompatible schema: the current schemas cannot read")
        assert "example.bank.Deposited.cents: new field without a default" in q["last_error"]
    assert (found["flaky"]["state"], found["flaky"]["restarts"]) == ("restarting", 4)
    refused = [m for m in said if "not restarted" in m]
    assert len(refused) == 2 and all("add a default or an upcaster" in m for m in refused), said
    supervisor.stop_queries()  # a refused query says why to the end
    assert {q["name"]: q["state"] for q in board.snapshot()["queries"]} == {
        "refused-at-start": "refused", "flaky": "stopped", "refused-later": "refused"}


def test_the_status_page_shows_why_a_query_is_refused() -> None:
    page = status_page().decode()
    assert ".state.refused" in page and 'q.state === "refused"' in page


def test_a_refused_projector_says_what_was_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import projections.job as job

    def incompatible(*_: Any) -> None:
        raise INCOMPATIBLE

    monkeypatch.setattr(job, "check_app_schemas", incompatible)
    with pytest.raises(IncompatibleSchemaError) as err:
        job.check_schemas(None, None, None, "the projector of bank/balances cannot start")  # type: ignore[arg-type]
    assert str(err.value).startswith("the projector of bank/balances cannot start: the current "
                                     "schemas cannot read stored data")
    assert err.value.__cause__ is INCOMPATIBLE


def test_a_rebuild_that_dead_lettered_says_how_many_and_what_to_do() -> None:
    err = RebuildDeadLettersError("domain_examples.bank:app", "bank", "balances", 4, 3, 1_200,
                                  50_000)
    text = str(err)
    assert text.startswith("the rebuild of bank/balances dead-lettered 1,200 of 50,000 events "
                           "into generation 4, so it did not switch: readers stay on "
                           "generation 3 and it was not dropped")
    assert "`cqrs projections dlq domain_examples.bank:app list --projection balances`" in text
    assert "`cqrs rebuild domain_examples.bank:app balances --force`" in text
    assert "`cqrs rebuild domain_examples.bank:app balances --force --allow-dead-letters`" in text
    assert (err.generation, err.readers_on, err.dead_letters, err.events) == (4, 3, 1_200, 50_000)
    first = RebuildDeadLettersError("m:app", "bank", "balances", 1, None, 1, 2)
    assert "readers still have no generation" in str(first)


def test_rebuild_takes_allow_dead_letters() -> None:
    parser = build_parser()
    assert not parser.parse_args(["rebuild", "m:app", "balances"]).allow_dead_letters
    assert parser.parse_args(["rebuild", "m:app", "balances", "--allow-dead-letters"]).allow_dead_letters


class _Producer:
    """Calls each delivery callback with ``error`` at flush, as librdkafka does for a record of a
    topic that does not exist (after 30 s): nothing is left to flush."""

    def __init__(self, error: Any) -> None:
        self.error = error
        self.callbacks: list[Any] = []

    def produce(self, topic: str, *, key: bytes, value: bytes, headers: Any,
                on_delivery: Any) -> None:
        self.callbacks.append(on_delivery)

    def flush(self, timeout: float) -> int:
        for callback in self.callbacks:
            callback(self.error, None)
        self.callbacks = []
        return 0


def test_a_dead_letter_kafka_refused_fails_the_batch_instead_of_being_lost() -> None:
    from projections.errors import ProjectionStoreError
    from projections.job import _WorkerContext
    from projections.records import DeadLetter, EventRecord
    from projections.testing import Balances

    ctx = _WorkerContext.__new__(_WorkerContext)  # no Kafka, no Cassandra: just its sender
    ctx.projection, ctx.dlq_topic = Balances(), "bank.projection-dead-letters"
    letter = DeadLetter(EventRecord("acc-1", "example.bank.Account", "example.bank.Deposited", 2,
                                    b"x", "2026-06-01T00:00:00+00:00", 0, 7), "handler", "boom", 2)
    ctx._producer = _Producer(None)
    ctx.send_dead_letters([letter])  # delivered
    ctx._producer = _Producer("UNKNOWN_TOPIC_OR_PART")
    with pytest.raises(ProjectionStoreError, match=r"could not write 1 dead letters to "
                       r"'bank.projection-dead-letters' \(Kafka refused 1: UNKNOWN_TOPIC_OR_PART\)"):
        ctx.send_dead_letters([letter])
