"""The retry job's pure decisions: letters parsed, due times, the re-delivered record, filters."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cqrs.client import encode_command
from cqrs.deadletters import parse_dead_letter
from cqrs.errors import ConfigError
from cqrs.kafka_io import KafkaRecord
from cqrs.processor import AggregateStep, InputRecord
from cqrs.retrier.plan import (
    PARKED, WAITING, LetterFilter, bucket_of, classify, delay_s, due_ms, letter_id, parse_age,
    redelivery,
)
from cqrs.retries import ATTEMPT_HEADER, Backoff, RetryPolicy
from cqrs.topics import topics_for
from domain_examples.bank import AuditAccount, OpenAccount
from domain_examples.bank import app as bank

POLICY = RetryPolicy(transient=["ComplianceServiceError"],
                     default=Backoff(initial_s=2.0, jitter=0.2, max_attempts=3))


def _letter(attempt: int, *, transient: bool = True) -> KafkaRecord:
    """A dead letter of the bank's AuditAccount (its handler raises ComplianceServiceError),
    written by the processor's step under ``POLICY`` (set on the app for the call)."""
    app = bank
    topics = topics_for(app.name)
    at = dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc)
    records = []
    for offset, command in enumerate([OpenAccount("mallory"), AuditAccount("eve")]):
        _, key, value, headers = encode_command(app, "acc-7", command, command_id=f"cmd-{offset}",
                                                timestamp=at)
        if offset == 1 and attempt > 1:
            headers = [*headers, (ATTEMPT_HEADER, str(attempt).encode())]
        records.append(InputRecord(key, value, headers, 0, offset, topics.commands))
    saved = app.retries
    app.retries = POLICY if transient else RetryPolicy()
    try:
        _, out = AggregateStep(app, app.codec, topics).run("bank.Account", "acc-7", None, records)
    finally:
        app.retries = saved
    (written,) = [r for r in out if r.topic == topics.dead_letters]
    return KafkaRecord(topics.dead_letters, 0, 5, written.key, written.value, written.headers,
                       1_800_000_000_000)


def test_a_transient_letter_is_parsed_with_its_attempt_and_waits() -> None:
    dead = parse_dead_letter(_letter(2))
    assert (dead.transient, dead.attempt, dead.final, dead.timestamp_ms) == (
        True, 2, False, 1_800_000_000_000)
    assert classify(dead) == WAITING and letter_id(dead) == "cmd-1"


def test_the_last_attempt_and_a_non_transient_letter_are_parked() -> None:
    assert classify(parse_dead_letter(_letter(3))) == PARKED
    plain = parse_dead_letter(_letter(1, transient=False))
    assert not plain.transient and classify(plain) == PARKED


def test_the_due_time_is_the_letters_time_plus_its_backoff_and_is_the_same_on_a_rerun() -> None:
    dead = parse_dead_letter(_letter(2))
    first = due_ms(POLICY, dead)
    assert first == due_ms(POLICY, dead)  # seeded by (command id, attempt): a re-run agrees
    wait = (first - dead.timestamp_ms) / 1000
    assert 4.0 * 0.8 <= wait <= 4.0 * 1.2  # attempt 2: initial 2 s * multiplier 2, +-20 %


@given(st.text(min_size=1, max_size=20), st.integers(1, 12))
def test_delays_are_deterministic_and_within_the_jitter(command_id: str, attempt: int) -> None:
    backoff = POLICY.default
    got = delay_s(POLICY, "bank.AuditAccount", "X", command_id, attempt)
    assert got == delay_s(POLICY, "bank.AuditAccount", "X", command_id, attempt)
    base = min(backoff.max_s, backoff.initial_s * backoff.multiplier ** (attempt - 1))
    assert base * (1 - backoff.jitter) <= got <= base * (1 + backoff.jitter)


@given(st.integers(0, 2**50), st.integers(1, 3600))
def test_a_due_time_falls_in_its_bucket(at: int, bucket_s: int) -> None:
    b = bucket_of(at, bucket_s)
    assert b * bucket_s * 1000 <= at < (b + 1) * bucket_s * 1000


def test_a_redelivery_keeps_key_and_value_and_replaces_the_attempt_header() -> None:
    headers = [("trace", b"t1"), (ATTEMPT_HEADER, b"2")]
    key, value, out = redelivery(b"acc-7", b"\x01value", headers, 3)
    assert (key, value) == (b"acc-7", b"\x01value")
    assert out == [("trace", b"t1"), (ATTEMPT_HEADER, b"3")]
    with pytest.raises(ValueError, match="attempt 2 or later"):
        redelivery(b"k", b"v", [], 1)


def test_ages_and_filters() -> None:
    assert [parse_age(t) for t in ("90", "30s", "15m", "2h", "1d")] == [90, 30, 900, 7200, 86400]
    with pytest.raises(ConfigError, match="'soon'"):
        parse_age("soon")
    with pytest.raises(ConfigError, match="'gone'"):
        LetterFilter(state="gone")
    f = LetterFilter(state=WAITING, command_type="bank.AuditAccount", older_than_s=60)
    row = dict(state=WAITING, command_type="bank.AuditAccount", error_type="E", first_ms=0)
    assert f.matches(**row, now_ms=60_000)
    assert not f.matches(**row, now_ms=59_999)
    assert not f.matches(**{**row, "state": PARKED}, now_ms=60_000)
    assert LetterFilter(state=None).matches(**{**row, "state": PARKED}, now_ms=0)


def test_open_means_waiting_or_parked() -> None:
    row = dict(command_type="c", error_type="e", first_ms=0, now_ms=0)
    assert LetterFilter().matches(state=WAITING, **row) and LetterFilter().matches(state=PARKED, **row)
    assert not LetterFilter().matches(state="done", **row)


def test_an_operators_retry_of_a_retried_letter_drops_the_attempt_header() -> None:
    from cqrs.deadletters import retry_record
    from cqrs.envelope import from_kafka

    dead = parse_dead_letter(_letter(3))  # attempt 3 came with cqrs.retry.attempt = 3
    assert dead.header(ATTEMPT_HEADER) == "3"
    key, value, headers = retry_record(dead)
    assert ATTEMPT_HEADER not in dict(headers)
    assert from_kafka(key, value, headers)[0].command_id == "cmd-1~retry@0:5"


@given(st.lists(st.tuples(st.sampled_from(["a", "trace", ATTEMPT_HEADER, "cqrs.x"]),
                          st.binary(max_size=4)), max_size=8), st.integers(2, 50))
def test_a_redelivery_carries_exactly_one_attempt_header_and_the_rest_unchanged(
        headers: list[tuple[str, bytes]], attempt: int) -> None:
    _, _, out = redelivery(b"k", b"v", headers, attempt)
    assert [v for k, v in out if k == ATTEMPT_HEADER] == [str(attempt).encode()]
    assert [h for h in out if h[0] != ATTEMPT_HEADER] == [h for h in headers
                                                          if h[0] != ATTEMPT_HEADER]
    assert redelivery(b"k", b"v", out, attempt)[2] == out  # delivering it again changes nothing
