"""What the retry job decides, as plain Python: no Kafka, Spark or Cassandra.

- :func:`classify` says what becomes of a dead letter: retried later (``waiting``), given up on
  (``parked``: transient but out of attempts, or not transient at all, left to operators);
- :func:`due_ms` is when the retry of a transient letter is due: the letter's own timestamp plus
  the app's backoff for (command type, error type), with a jitter drawn from a generator seeded
  by (command id, attempt), so a re-run of the job computes the same time;
- :func:`redelivery` is the record delivered again: key and value unchanged, the original
  headers without an old attempt header, plus ``cqrs.retry.attempt = n + 1``;
- :class:`LetterFilter` picks letters for ``cqrs dlq list`` and its HTTP twin.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import attrs

from cqrs.deadletters import DeadLetter
from cqrs.errors import ConfigError
from cqrs.retries import ATTEMPT_HEADER, RetryPolicy
from cqrs.scheduler.due import bucket_of

__all__ = [
    "DONE",
    "OPEN",
    "PARKED",
    "STATES",
    "WAITING",
    "LetterFilter",
    "bucket_of",
    "classify",
    "delay_s",
    "due_ms",
    "letter_id",
    "parse_age",
    "redelivery",
]

WAITING = "waiting"  # a retry is due at some time: the job delivers it by itself
PARKED = "parked"  # given up on: an operator retries, purges or leaves it
DONE = "done"  # retried (its outcome is in its history) or sent again by an operator
STATES = (WAITING, PARKED, DONE)
OPEN = "open"  # a filter: waiting or parked, what still needs the job or an operator


def letter_id(dead: DeadLetter) -> str:
    """The id of a letter's history: its command id, or ``@partition:offset`` in the
    dead-letters topic when the command id is unreadable."""
    return dead.command_id or f"@{dead.position}"


def classify(dead: DeadLetter) -> str:
    """``waiting`` for a transient letter with attempts left, else ``parked``."""
    return WAITING if dead.transient and not dead.final else PARKED


def delay_s(policy: RetryPolicy, command_type: str, error_type: str, command_id: str,
            attempt: int) -> float:
    """Seconds between failed attempt ``attempt`` and the next one: the app's backoff for the
    command and error types, its jitter drawn from a generator seeded by (id, attempt)."""
    rng = random.Random(f"{command_id}\x00{attempt}")
    return policy.backoff(command_type, error_type).delay_s(attempt, rng)


def due_ms(policy: RetryPolicy, dead: DeadLetter) -> int:
    """When the retry of ``dead`` is due (epoch ms): its timestamp plus :func:`delay_s`."""
    wait = delay_s(policy, dead.message_type or "", dead.error_type, letter_id(dead), dead.attempt)
    return dead.timestamp_ms + round(wait * 1000)


def redelivery(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]],
               attempt: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """The command record delivering attempt ``attempt`` (2, 3...) of a dead-lettered command:
    the same key and value (so the same command id), the original headers without an old
    attempt header, and ``cqrs.retry.attempt``."""
    if attempt < 2:
        raise ValueError(f"attempt {attempt!r}: a re-delivery is attempt 2 or later")
    kept = [(k, v) for k, v in headers if k != ATTEMPT_HEADER]
    return key, value, [*kept, (ATTEMPT_HEADER, str(attempt).encode())]


_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(text: str) -> float:
    """Seconds in an age like ``90``, ``30s``, ``15m``, ``2h``, ``1d``."""
    found = _AGE.match(text)
    if found is None:
        raise ConfigError(f"age {text!r} is not a number with an optional unit s, m, h or d "
                          "(e.g. 30s, 15m, 2h, 1d)")
    return float(found.group(1)) * _UNIT_S[found.group(2) or "s"]


@attrs.frozen(kw_only=True)
class LetterFilter:
    """Which letters to show or act on; ``None`` matches anything. ``state``: one of
    :data:`STATES`, or ``open`` (waiting or parked). ``older_than_s``: letters whose first
    failure is at least that old."""

    state: str | None = OPEN
    command_type: str | None = None
    error_type: str | None = None
    older_than_s: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.state is not None and self.state not in (*STATES, OPEN):
            raise ConfigError(f"letter state {self.state!r}: use one of "
                              f"{', '.join((*STATES, OPEN))}")

    def matches(self, *, state: str, command_type: str | None, error_type: str | None,
                first_ms: int, now_ms: int) -> bool:
        wanted = (WAITING, PARKED) if self.state == OPEN else (self.state,)
        return ((self.state is None or state in wanted)
                and (self.command_type is None or command_type == self.command_type)
                and (self.error_type is None or error_type == self.error_type)
                and (self.older_than_s is None or now_ms - first_ms >= self.older_than_s * 1000))
