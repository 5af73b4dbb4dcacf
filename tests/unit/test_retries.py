"""The retry policy an app declares: transient errors and backoff (pure code)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cqrs.errors import ConfigError
from cqrs.retries import Backoff, RetryPolicy, error_name
from cqrs.testing.example import Deposit


class Unavailable(ConnectionError):
    pass


def test_transient_errors_match_by_class_and_subclass_and_name() -> None:
    policy = RetryPolicy(transient=[ConnectionError, "ComplianceServiceError"])
    assert policy.transient == ("ConnectionError", "ComplianceServiceError")
    assert policy.is_transient(["Unavailable", "ConnectionError", "OSError", "Exception"])
    assert policy.is_transient(["ComplianceServiceError"])
    assert not policy.is_transient(["RuntimeError", "Exception"])
    assert not RetryPolicy().is_transient(["ConnectionError"])  # nothing declared: nothing retried


def test_the_error_types_backoff_wins_over_the_commands_which_wins_over_the_default() -> None:
    slow, fast = Backoff(initial_s=10), Backoff(initial_s=0.1)
    policy = RetryPolicy(transient=[Unavailable], by_command={Deposit: slow}, by_error={Unavailable: fast})
    assert policy.backoff("example.bank.Deposit", "Unavailable") is fast
    assert policy.backoff("example.bank.Deposit", "TimeoutError") is slow
    assert policy.backoff("example.bank.Withdraw", "TimeoutError") == Backoff()


@given(st.integers(1, 40), st.floats(0.01, 5), st.floats(1, 4), st.floats(0, 0.9), st.integers(0, 2**32))
def test_delays_grow_exponentially_within_the_cap_and_the_jitter(
        attempt: int, initial: float, multiplier: float, jitter: float, seed: int) -> None:
    b = Backoff(initial_s=initial, multiplier=multiplier, max_s=60, jitter=jitter)
    base = min(60, initial * multiplier ** (attempt - 1))
    d = b.delay_s(attempt, random.Random(seed))
    assert base * (1 - jitter) - 1e-9 <= d <= base * (1 + jitter) + 1e-9


@pytest.mark.parametrize("bad", [dict(initial_s=0), dict(jitter=1.0), dict(max_attempts=0), dict(max_s=-1)])
def test_a_bad_backoff_is_refused_with_the_value(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=str(next(iter(bad.values())))):
        Backoff(**bad)  # type: ignore[arg-type]


def test_a_transient_error_must_be_an_exception_class_or_name() -> None:
    assert error_name(TimeoutError) == "TimeoutError"
    with pytest.raises(ConfigError, match="42"):
        RetryPolicy(transient=[42])  # type: ignore[list-item]
