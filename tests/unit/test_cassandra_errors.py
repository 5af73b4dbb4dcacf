"""How a failed concurrent Cassandra request is reported (pure: no Cassandra)."""

from __future__ import annotations

from concurrent.futures import Future, InvalidStateError

from cqrs.cassandra_io import _cause


def test_a_finished_future_error_reports_the_statements_own_error() -> None:
    future: Future[int] = Future()
    future.set_exception(RuntimeError("Unknown CF 1234"))
    try:
        try:
            future.result()
        except RuntimeError:
            future.set_exception(RuntimeError("again"))  # what the driver does: raises FINISHED
    except InvalidStateError as exc:
        assert str(_cause(exc)) == "Unknown CF 1234"
    else:
        raise AssertionError("setting a finished future's exception did not raise")


def test_any_other_error_is_reported_as_it_is() -> None:
    error = ValueError("table does not exist")
    assert _cause(error) is error
