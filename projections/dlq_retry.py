"""Automatic retries of parked projection views: the projector replays a parked aggregate's
(or re-keyed view's) dead letters after a backoff and releases it when they all apply.

A *parking* starts when a handler fails (or a version is missing): the projector parks the
view and sends the event and its successors to the projection dead-letter topic (see
:mod:`projections.fold`). The projector's driver records it as a *letter* of the retry tables of
:mod:`cqrs.retrier.store` (its own partition per projection and generation, id
``<view key>@<parked version>``), attempt 1 failed, due after the app's backoff
(``RetryPolicy.projections`` / ``by_projection``). A timer of the same driver replays the due
ones with :func:`projections.dlq.replay_dead_letters`, holding the lock the projector's
micro-batches hold, so a replay never runs while a batch of the same projection is applied:

- every letter applies: the view is released (un-parked), the letter is ``done``;
- a handler still fails: attempt ``n + 1`` failed (its error kept), due after the backoff, or
  ``parked`` for an operator once ``max_attempts`` attempts failed (``cqrs projections dlq
  list`` shows it with its history; ``replay`` releases it by hand).

A replay reads the dead-letter topic from the offsets it had before the batch that parked the
view (from its beginning when the parking's start is not known: a view found parked behind a
gap, or parked before this driver ran), so it sees every held-back event in order.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.config import CqrsConfig
from cqrs.retrier.plan import DONE, PARKED, WAITING, bucket_of
from cqrs.retrier.store import AttemptRow, DueEntry, LetterRow, RetryStore, now_ms
from cqrs.retries import Backoff
from projections.apply import Target
from projections.dlq import from_dlq_record, replay_dead_letters
from projections.errors import ProjectionError
from projections.fold import Decode
from projections.model import Projection, RekeyedProjection
from projections.personal import stack_store
from projections.records import DeadLetter
from projections.store import ProjectionStore

__all__ = [
    "Parking",
    "ProjectionRetrier",
    "ProjectionRetryError",
    "RoundStats",
    "episode_id",
    "letters_by_view",
    "next_attempt",
    "parkings_of",
    "retry_table_app",
]

REPLAYED = "replayed"  # an attempt whose retry ran: its outcome says how it went
RELEASED = "released"
FAILED_AGAIN = "failed again"


class ProjectionRetryError(ProjectionError, RuntimeError):
    """The retries of a projection's parked views failed round after round."""


@attrs.frozen
class Parking:
    """A view a batch dead-lettered events of: parked now (``reason`` handler or gap, the
    failing event's ``message_type`` and ``error``), or held back already (``parked``)."""

    key: str
    parked_at: int
    reason: str
    error: str
    message_type: str


def episode_id(key: str, parked_at: int) -> str:
    """The id of a parking in the retry tables: the view key and the version it parked at."""
    return f"{key}@{parked_at}"


def retry_table_app(topic_base: str, projection: str, generation: int) -> str:
    """The retry tables' ``app`` (partition) of one projection generation's parkings."""
    return f"{topic_base}#projection.{projection}.g{generation}"


def letters_by_view(projection: Projection, letters: Iterable[DeadLetter],
                    decode: Decode) -> dict[str, list[DeadLetter]]:
    """Dead letters per view key, in their order: the aggregate id, or a re-keyed
    projection's ``key_of`` of the event."""
    out: dict[str, list[DeadLetter]] = {}
    chosen = list(letters)
    if not isinstance(projection, RekeyedProjection):
        for dl in chosen:
            out.setdefault(dl.record.aggregate_id, []).append(dl)
        return out
    from projections.rekeyed import group_by_view

    by_record = {id(dl.record): dl for dl in chosen}
    for key, items in group_by_view(projection, [dl.record for dl in chosen], decode).items():
        out[key] = [by_record[id(rec)] for rec, _ in items]
    return out


def parkings_of(projection: Projection, letters: Iterable[DeadLetter],
                decode: Decode) -> list[Parking]:
    """One :class:`Parking` per view among ``letters`` (a batch's dead letters: per view, the
    failing event's letter first)."""
    out = []
    for key, mine in letters_by_view(projection, letters, decode).items():
        first = mine[0]
        out.append(Parking(key, first.parked_at, first.reason, first.error,
                           first.record.message_type))
    return out


def next_attempt(backoff: Backoff | None, episode: str, attempt: int,
                 failed_ms: int) -> tuple[str, int | None]:
    """``(state, due_ms)`` after failed attempt ``attempt`` (1: the projector's own failure):
    ``waiting`` until ``failed_ms`` plus the backoff's delay (its jitter seeded by the episode
    and attempt, so a re-run computes the same time), or ``parked`` once the attempts are used
    up (at once without a backoff)."""
    if backoff is None or attempt >= backoff.max_attempts:
        return PARKED, None
    wait = backoff.delay_s(attempt, random.Random(f"{episode}\x00{attempt}"))
    return WAITING, failed_ms + round(wait * 1000)


def _error_type(error: str) -> str:
    head, sep, _ = error.partition(": ")
    return head if sep and head.isidentifier() else ""


@attrs.define
class RoundStats:
    """One round of the timer."""

    due: int = 0
    released: int = 0
    failed: int = 0  # failed again, waiting for the next attempt
    parked: int = 0  # out of attempts: parked for an operator
    stale: int = 0  # entries of letters released or closed meanwhile
    errors: int = 0  # rounds failed in a row (this one included), waited out up to a limit
    seconds: float = 0.0


@attrs.define
class _Open:
    """A parking not released yet, as the driver keeps it."""

    id: str
    key: str
    parked_at: int
    attempt: int
    state: str
    due_ms: int | None


class ProjectionRetrier:
    """The retries of one projection generation's parked views (driver side).

    ``lock`` is held by :meth:`deliver_due` and must be held by whoever applies a micro-batch of
    the same projection generation (the projector), so that the two never interleave."""

    def __init__(self, cfg: CqrsConfig, app: App, projection: Projection, topic_base: str,
                 base: str, generation: int, dlq_topic: str, schemas_topic: str,
                 store: ProjectionStore) -> None:
        self.cfg = cfg
        self.app = app
        self.projection = projection
        self.target = Target(projection, base, generation)
        self.dlq_topic = dlq_topic
        self.schemas_topic = schemas_topic
        self.views = stack_store(store, cfg, app)  # personal columns sealed and opened
        self.backoff = app.retries.projection_backoff(projection.name)
        self.app_key = retry_table_app(topic_base, projection.name, generation)
        self.lock = threading.RLock()
        self.max_due = cfg.retrier.max_due_per_trigger
        # rounds failing in a row (Cassandra or Kafka unavailable) before the query is stopped
        self.max_failures = max(3, round(30 / max(cfg.retrier.interval_s, 0.1)))
        self._failures = 0
        self._store: RetryStore | None = None
        self._open: dict[str, _Open] | None = None
        self._cursor: int | None = None
        self._mark: dict[int, int] | None = None
        self._offsets: Any = None
        self._schemas: Any = None
        self._decode: Decode | None = None

    # ---- resources -------------------------------------------------------------------------

    @property
    def store(self) -> RetryStore:
        if self._store is None:
            self._store = RetryStore(self.cfg, self.app_key)
            self._cursor = self._store.cursor()
        return self._store

    @property
    def decode(self) -> Decode:
        if self._decode is None:
            from cqrs.codec.kafka_schema_store import KafkaSchemaStore
            from cqrs.personal.stack import key_store_for

            key_store = key_store_for(self.cfg, self.app)
            self._schemas = KafkaSchemaStore(self.cfg.kafka.bootstrap_servers, self.schemas_topic,
                                             self.cfg.kafka.client_options())
            self._decode = self.app.codec_for(self._schemas, key_store=key_store).decode
        return self._decode

    def close(self) -> None:
        for thing in (self._offsets, self._schemas, self._store):
            if thing is not None:
                thing.close()
        self._offsets = self._schemas = self._store = None
        self._decode = None

    def mark_dead_letters(self) -> None:
        """Note the dead-letter topic's ends: the letters of a later batch are at or after
        them (call before the first batch, and after each batch that wrote dead letters)."""
        from cqrs.kafka_io import OffsetReader

        if self._offsets is None:
            self._offsets = OffsetReader(self.cfg, self.dlq_topic)
        self._mark = {p: high for p, (_, high) in self._offsets.watermarks().items()}

    def _opened(self) -> dict[str, _Open]:
        if self._open is None:
            self._open = {}
            for row in self.store.letters():
                if row.state in (WAITING, PARKED) and row.aggregate_id is not None:
                    parked_at = int(row.command_id.rpartition("@")[2])
                    self._open[row.aggregate_id] = _Open(row.command_id, row.aggregate_id, parked_at,
                                                         row.attempts or 1, row.state, row.due_ms)
        return self._open

    # ---- recording parkings ----------------------------------------------------------------

    def record(self, parkings: Sequence[Parking], at_ms: int | None = None) -> int:
        """Record the parkings of a batch (idempotent: a re-run batch changes nothing); returns
        how many are new. Call with :attr:`lock` held, after the batch is applied."""
        if not parkings:
            return 0
        now = now_ms() if at_ms is None else at_ms
        opened = self._opened()
        new: list[tuple[Parking, str | None]] = []
        seen: set[str] = set()
        for p in parkings:
            if p.key in seen:
                continue
            seen.add(p.key)
            current = opened.get(p.key)
            if p.reason == "parked":  # held back behind a parking: recorded unless known
                if current is None:
                    new.append((p, None))  # where it began is unknown: read the whole topic
                continue
            if current is not None and current.parked_at == p.parked_at:
                continue  # a re-run of the batch that parked it
            if current is not None:  # released meanwhile (by an operator), parked again now
                self._close(current, now, f"{RELEASED} (parked again at version {p.parked_at})")
            starts = None if p.reason == "gap" or self._mark is None else _starts_json(self._mark)
            new.append((p, starts))
        rows = []
        for p, starts in new:
            eid = episode_id(p.key, p.parked_at)
            state, due = next_attempt(self.backoff, eid, 1, now)
            rows.append(_attempt(eid, 1, p.key, now, p.reason, p.error, p.message_type, state, due,
                                 starts))
        if not rows:
            return 0
        found = self.store.insert_attempts(rows)
        letters: list[tuple[str, int, dict[str, Any]]] = []
        due_entries: list[DueEntry] = []
        for (p, _), row, (inserted, state, stored_due) in zip(new, rows, found, strict=True):
            if state in (WAITING, PARKED):  # not one closed before (a batch re-run much later)
                opened[p.key] = _Open(row.command_id, p.key, p.parked_at, 1, state, stored_due)
            if state == WAITING and stored_due is not None:
                due_entries.append(DueEntry(bucket_of(stored_due, self.store.bucket_s), stored_due,
                                            row.command_id, 1))
            if inserted:
                letters.append((row.command_id, now * 1000 + 1, _letter_columns(row, first=True)))
        self.store.put_letters(letters)
        self._add_due(due_entries)
        return len(letters)

    def _add_due(self, entries: Sequence[DueEntry]) -> None:
        if not entries:
            return
        self.store.add_due(entries)
        low = min(e.due_ms for e in entries)
        if self._cursor is None or low < self._cursor:
            self._cursor = low
            self.store.save_cursor(low)

    def _close(self, current: _Open, now: int, outcome: str) -> None:
        """A parking found released: its last attempt's outcome, the letter done."""
        store = self.store
        if current.state == WAITING:
            store.set_attempt(current.id, current.attempt, state=REPLAYED, delivered_ms=now,
                              outcome=outcome)
            if current.due_ms is not None:
                store.delete_due([DueEntry(bucket_of(current.due_ms, store.bucket_s),
                                           current.due_ms, current.id, current.attempt)])
        else:
            store.set_attempt(current.id, current.attempt, outcome=outcome)
        store.put_letter(current.id, now * 1000 + current.attempt + 1, state=DONE, last_ms=now,
                         due_ms=None)
        assert self._open is not None
        self._open.pop(current.key, None)

    # ---- the timer -------------------------------------------------------------------------

    def deliver_due(self, at_ms: int | None = None) -> RoundStats:
        """One round: replay the parkings due at ``at_ms`` (default: now). The name is the one
        :class:`cqrs.retrier.job.RetrierQuery`'s timer calls."""
        started = time.perf_counter()
        with self.lock:
            try:
                stats = self._round(now_ms() if at_ms is None else at_ms)
            except Exception as exc:  # noqa: BLE001 - a few in a row are waited out
                self._open = None  # read again from the tables: the round may have stopped half-way
                self._failures += 1
                if self._failures >= self.max_failures:
                    raise ProjectionRetryError(
                        f"retries of projection {self.projection.name!r} (generation "
                        f"{self.target.generation}) failed {self._failures} rounds in a row, last: "
                        f"{type(exc).__name__}: {exc}; check Cassandra and Kafka (`cqrs dev status`); "
                        "the projector's query stops and is restarted, parked views wait meanwhile"
                    ) from exc
                return RoundStats(errors=self._failures, seconds=time.perf_counter() - started)
            self._failures = 0
        stats.seconds = time.perf_counter() - started
        return stats

    def _due(self, now: int) -> list[DueEntry]:
        """What is due from the cursor to ``now`` (the due table's slices, see
        :meth:`cqrs.scheduler.due.DueTable.read_due`)."""
        if self._cursor is None:
            return []
        entries, _, _ = self.store.due(self._cursor, now, self.max_due)
        return entries

    def _round(self, now: int) -> RoundStats:
        stats = RoundStats()
        opened = self._opened()
        # this driver alone makes parkings wait, so the earliest due time is known here: an
        # idle round reads nothing
        soonest = min((c.due_ms for c in opened.values() if c.state == WAITING
                       and c.due_ms is not None), default=None)
        if soonest is None or soonest > now:  # nothing below it: the cursor moves up to it
            self._advance(now + 1 if soonest is None else soonest)
            return stats
        entries = self._due(now)
        stats.due = len(entries)
        if not entries:
            self._advance(now + 1)
            return stats
        store = self.store
        rows = store.attempts_of([(e.command_id, e.attempt) for e in entries])
        chosen: list[tuple[DueEntry, AttemptRow, _Open]] = []
        for entry, row in zip(entries, rows, strict=True):
            current = opened.get(row.aggregate_id or "") if row is not None else None
            if row is None or row.state != WAITING or current is None or current.id != row.command_id:
                stats.stale += 1
                continue
            chosen.append((entry, row, current))
        before = self.views.read_views(self.projection, self.target.base, self.target.generation,
                                       [c.key for _, _, c in chosen]) if chosen else {}
        replay = [(e, r, c) for e, r, c in chosen if (v := before.get(c.key)) is not None
                  and v.parked_at is not None]
        errors = self._replay(replay) if replay else {}
        after = self.views.read_views(self.projection, self.target.base, self.target.generation,
                                      [c.key for _, _, c in replay]) if replay else {}
        letters: list[tuple[str, int, dict[str, Any]]] = []
        new_rows: list[AttemptRow] = []
        # writes in an order a round that dies half-way can be run again from: the next
        # attempts and their due entries first, then the replayed marks, the letters' states,
        # and last the deletion of the entries read (an entry whose attempt is still waiting
        # is replayed again, which changes nothing that applied)
        marks: list[tuple[str, int, str]] = []
        closed: list[str] = []
        for entry, row, current in chosen:
            view = after.get(current.key) if current.key in after else before.get(current.key)
            n = row.attempt
            if view is None or view.parked_at is None:
                how = RELEASED if current.key in after else f"{RELEASED} (by a replay)"
                marks.append((row.command_id, n, how))
                letters.append((row.command_id, now * 1000 + n + 1,
                                {"state": DONE, "last_ms": now, "due_ms": None}))
                closed.append(current.key)
                stats.released += 1
                continue
            error = errors.get(current.key) or (
                f"no dead letter of {current.key!r} applies after version {view.version}: is the "
                f"event at version {view.version + 1} in {self.dlq_topic!r}?")
            marks.append((row.command_id, n, FAILED_AGAIN))
            state, due = next_attempt(self.backoff, row.command_id, n + 1, now)
            again = _attempt(row.command_id, n + 1, current.key, now, "replay", error,
                             row.command_type, state, due, row.offsets)
            new_rows.append(again)
            letters.append((row.command_id, now * 1000 + n + 1, _letter_columns(again, first=False)))
            if state == PARKED:
                stats.parked += 1
            else:
                stats.failed += 1
        if new_rows:
            store.insert_attempts(new_rows)
        self._add_due([DueEntry(bucket_of(r.due_ms, store.bucket_s), r.due_ms, r.command_id,
                                r.attempt) for r in new_rows if r.due_ms is not None])
        for command_id, n, outcome in marks:
            store.set_attempt(command_id, n, state=REPLAYED, delivered_ms=now, outcome=outcome)
        store.put_letters(letters)
        store.delete_due(entries)
        for key in closed:
            opened.pop(key, None)
        for r in new_rows:
            current = opened[r.aggregate_id or ""]
            current.attempt, current.state, current.due_ms = r.attempt, r.state or "", r.due_ms
        if len(entries) < self.max_due:
            self._advance(now + 1, save=True)
        return stats

    def _advance(self, cursor: int, *, save: bool = False) -> None:
        """Every entry below ``cursor`` was read (and deleted): the next round starts there,
        unless an entry added meanwhile is due earlier. Saved after a round that replayed
        something, or when the cursor enters another bucket (not every idle round: a restart
        reads at most a bucket again)."""
        if self._cursor is None or cursor <= self._cursor:
            return
        low = min((c.due_ms for c in self._opened().values()
                   if c.state == WAITING and c.due_ms is not None), default=cursor)
        moved = bucket_of(self._cursor, self.store.bucket_s) != bucket_of(cursor, self.store.bucket_s)
        self._cursor = min(cursor, low)
        if save or moved:
            self.store.save_cursor(self._cursor)

    def _replay(self, chosen: Sequence[tuple[DueEntry, AttemptRow, _Open]]) -> dict[str, str]:
        """Replay the letters of the chosen views; the error of each one still failing."""
        import json

        from cqrs.kafka_io import read_to_end

        known = [json.loads(row.offsets) if row.offsets else None for _, row, _ in chosen]
        starts = None  # from the beginning, when one parking's start is unknown
        if all(k is not None for k in known):
            # per partition the earliest start; one that a parking does not name: from 0
            partitions = set().union(*known)  # type: ignore[arg-type]
            starts = {(self.dlq_topic, int(p)): min(int(k.get(p, 0)) for k in known)  # type: ignore[union-attr]
                      for p in partitions}
        records = read_to_end(self.cfg, [self.dlq_topic], starts=starts)
        mine = [e.letter for e in (from_dlq_record(r.key or b"", r.value or b"", r.headers)
                                   for r in records) if e.projection == self.projection.name]
        by_view = letters_by_view(self.projection, mine, self.decode)
        wanted = [dl for _, _, c in chosen for dl in by_view.get(c.key, [])]
        report = replay_dead_letters(self.views, self.target, wanted, self.decode)
        return {p.key: p.error for p in parkings_of(self.projection, report.failed, self.decode)}

    # ---- after an operator's replay ----------------------------------------------------------

    def settle(self, at_ms: int | None = None) -> int:
        """Close the parkings whose views are released (by ``cqrs projections dlq replay``);
        returns how many."""
        now = now_ms() if at_ms is None else at_ms
        with self.lock:
            opened = list(self._opened().values())
            if not opened:
                return 0
            views = self.views.read_views(self.projection, self.target.base,
                                          self.target.generation, [c.key for c in opened])
            done = [c for c in opened if (v := views.get(c.key)) is None or v.parked_at is None]
            for c in done:
                self._close(c, now, f"{RELEASED} (by a replay)")
            return len(done)

    def open_letters(self) -> list[tuple[LetterRow, list[AttemptRow]]]:
        """The parkings not released yet (waiting for a retry, or parked for an operator),
        oldest first, each with its attempts."""
        rows = [r for r in self.store.letters() if r.state in (WAITING, PARKED)]
        rows.sort(key=lambda r: (r.first_ms or 0, r.command_id))
        return [(r, self.store.attempts(r.command_id)) for r in rows]


def _starts_json(mark: dict[int, int]) -> str:
    import json

    return json.dumps({str(p): o for p, o in sorted(mark.items())})


def _attempt(eid: str, attempt: int, key: str, failed_ms: int, stage: str, error: str,
             message_type: str | None, state: str, due: int | None,
             offsets: str | None) -> AttemptRow:
    return AttemptRow(
        command_id=eid, attempt=attempt, letter=None, failed_ms=failed_ms, stage=stage,
        error_type=_error_type(error), error=error, command_type=message_type, aggregate_id=key,
        final=state == PARKED, state=state, due_ms=due, delivering_ms=None, delivered_ms=None,
        outcome=PARKED if state == PARKED else None, note=None, key=None, value=None, headers=None,
        offsets=offsets)


def _letter_columns(row: AttemptRow, *, first: bool) -> dict[str, Any]:
    columns: dict[str, Any] = dict(
        state=row.state, attempts=row.attempt, command_type=row.command_type,
        error_type=row.error_type, error=row.error, aggregate_id=row.aggregate_id,
        last_ms=row.failed_ms, due_ms=row.due_ms)
    if first:
        columns["first_ms"] = row.failed_ms
    return columns


Report = Callable[[RoundStats], None]
__all__ += ["Report"]
