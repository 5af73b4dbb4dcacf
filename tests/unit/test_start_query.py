"""start_query: a query whose Python worker did not connect back in time is started again;
any other failure is said at once (pure code: the queries are plain objects with a streaming
query's attributes)."""

from __future__ import annotations

from typing import Any

import pytest

from cqrs.spark_session import CONNECT_BACK, QueryStartError, start_query

TIMEOUT_S = 5.0


class Query:
    """As a StreamingQuery looks to start_query: failed as it started, or running."""

    def __init__(self, name: str, error: str | None) -> None:
        self.name = name
        self.error = error
        self.isActive = error is None
        self.lastProgress: dict[str, Any] | None = {"batchId": 0} if error is None else None
        self.status = {"message": "Waiting for data to arrive"}
        self.stopped = False

    def exception(self) -> str | None:
        return self.error

    def stop(self) -> None:
        self.stopped = True


def starts(*errors: str | None) -> tuple[list[Query], Any]:
    made: list[Query] = []

    def start() -> Query:
        made.append(Query("cqrs-processor-loyalty", errors[len(made)]))
        return made[-1]

    return made, start


def test_a_worker_that_did_not_connect_back_is_started_again() -> None:
    made, start = starts(f"org.apache.spark.SparkException: {CONNECT_BACK}.", None)
    assert start_query(start, timeout_s=TIMEOUT_S) is made[1]
    assert len(made) == 2


def test_any_other_failure_is_said_at_once_with_the_querys_error() -> None:
    made, start = starts("TopicNotFoundError: topic 'x.commands' does not exist", None)
    with pytest.raises(QueryStartError, match=r"cqrs-processor-loyalty did not start \(attempt 1 "
                                              r"of 3\): TopicNotFoundError"):
        start_query(start, timeout_s=TIMEOUT_S)
    assert len(made) == 1


def test_the_attempts_are_bounded() -> None:
    made, start = starts(*[CONNECT_BACK] * 3)
    with pytest.raises(QueryStartError, match="attempt 3 of 3"):
        start_query(start, timeout_s=TIMEOUT_S)
    assert len(made) == 3


def test_a_query_still_initialising_when_the_time_is_up_is_stopped_and_said() -> None:
    slow = Query("cqrs-projector-bank-balances", None)
    slow.lastProgress, slow.status = None, {"message": "Initializing sources"}
    with pytest.raises(QueryStartError, match="not past initialising its sources after 0.3 s"):
        start_query(lambda: slow, timeout_s=0.3)
    assert slow.stopped
