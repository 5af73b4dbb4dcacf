"""Forgetting a data subject on the stack, as steps that a run interrupted at any point (a
crash, a SIGKILL) finishes when run again.

1. **record** the request: a row of ``cqrs_forget_requests`` in the keyspace of the key table
   (subject, status, when requested; the subject's id only, never personal data);
2. **delete the key** (:meth:`KeyStore.forget`): from here on every copy of the subject's
   personal fields reads as its replacement;
3. **rewrite** what holds copies readable without the key: the *forget steps* the caller
   passes, e.g. the read models' (:func:`projections.personal.forget_step`: each row of the
   subject's gets its personal columns rewritten to the replacement). The ``cqrs`` core does not
   know the projections package: the CLI and the HTTP service, which see both sides, pass it;
4. mark the request **done**.

Every step is idempotent, and every run does every step: a run after a crash after step 2 finds
no key to delete (it says the key was deleted by the run that stopped) and does steps 3 and 4.
An app that binds its own key store (``app.use_key_store``) keeps the record in memory.

``CQRS_FORGET_PAUSE_AFTER=record|key|rewrite`` (for tests of the crash) makes a run print
``pausing after <step>`` and sleep there for 10 minutes, to be killed.
"""

from __future__ import annotations

import abc
import datetime as _dt
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from cqrs.personal.cassandra_keys import CassandraKeyStore
from cqrs.personal.keys import KeyCache, KeyStore

if TYPE_CHECKING:
    from cqrs.app import App
    from cqrs.config import CqrsConfig

__all__ = ["FORGET_TABLE", "ForgetJournal", "ForgetOutcome", "ForgetStep", "PAUSE_ENV",
           "journal_for", "run_forget"]

FORGET_TABLE = "cqrs_forget_requests"
PAUSE_ENV = "CQRS_FORGET_PAUSE_AFTER"
STEPS = ("record", "key", "rewrite")

Report = Callable[[str], None]
ForgetStep = Callable[["CqrsConfig", "App", str, KeyStore, Report], int]
"""``step(cfg, app, subject, key_store, report) -> rows rewritten``: a place that keeps copies
of personal data readable without the key rewrites the subject's (idempotent)."""


@attrs.frozen
class Request:
    """A recorded forget request."""

    subject: str
    status: str  # requested, key_deleted, rewritten, done
    requested_at: _dt.datetime
    key_deleted: bool = False


class ForgetJournal(abc.ABC):
    """Where forget requests are recorded."""

    @abc.abstractmethod
    def get(self, subject: str) -> Request | None:
        """The request recorded for ``subject``, if any."""

    @abc.abstractmethod
    def put(self, request: Request, rows: int = 0) -> None:
        """Record ``request`` (replacing the subject's row)."""


class MemoryForgetJournal(ForgetJournal):
    def __init__(self) -> None:
        self._rows: dict[str, Request] = {}
        self._lock = threading.Lock()

    def get(self, subject: str) -> Request | None:
        with self._lock:
            return self._rows.get(subject)

    def put(self, request: Request, rows: int = 0) -> None:
        with self._lock:
            self._rows[request.subject] = request


class CassandraForgetJournal(ForgetJournal):
    """Table :data:`FORGET_TABLE` next to the key table (created when missing)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        session.execute(f"CREATE TABLE IF NOT EXISTS {FORGET_TABLE} (subject text PRIMARY KEY, "
                        "status text, requested_at timestamp, updated_at timestamp, "
                        "key_deleted boolean, rows_rewritten int)")

    def get(self, subject: str) -> Request | None:
        row = self.session.execute(
            f"SELECT status, requested_at, key_deleted FROM {FORGET_TABLE} WHERE subject = %s",
            (subject,)).one()
        if row is None:
            return None
        at = row[1].replace(tzinfo=_dt.timezone.utc) if row[1] is not None else _now()
        return Request(subject, row[0] or "requested", at, bool(row[2]))

    def put(self, request: Request, rows: int = 0) -> None:
        self.session.execute(
            f"INSERT INTO {FORGET_TABLE} (subject, status, requested_at, updated_at, key_deleted, "
            "rows_rewritten) VALUES (%s, %s, %s, %s, %s, %s)",
            (request.subject, request.status, request.requested_at, _now(), request.key_deleted,
             rows))


_MEMORY = MemoryForgetJournal()


def journal_for(store: KeyStore) -> ForgetJournal:
    """The journal beside ``store``: the Cassandra table when the keys are in Cassandra, else
    one in this process's memory."""
    inner = store.store if isinstance(store, KeyCache) else store
    if isinstance(inner, CassandraKeyStore):
        return CassandraForgetJournal(inner.session)
    return _MEMORY


@attrs.frozen
class ForgetOutcome:
    """What a run of :func:`run_forget` did."""

    subject: str
    deleted_now: bool  # this run deleted the key
    resumed: Request | None  # the unfinished request this run finished, if any
    rows_rewritten: int

    @property
    def forgotten(self) -> bool:
        """Whether the subject's key was deleted by this run or by the interrupted run it
        finished (HTTP ``"status": "forgotten"``)."""
        return self.deleted_now or (self.resumed is not None and self.resumed.key_deleted)


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def _pause(step: str, report: Report) -> None:
    if os.environ.get(PAUSE_ENV) == step:
        report(f"pausing after {step} ({PAUSE_ENV})")
        time.sleep(600)


def run_forget(cfg: CqrsConfig, app: App, subject: str, store: KeyStore,
               steps: Sequence[ForgetStep] = (), report: Report = lambda _: None) -> ForgetOutcome:
    """Forget ``subject``: record, delete the key, run ``steps``, mark done (the module doc);
    ``report`` gets a line per step."""
    journal = journal_for(store)
    earlier = journal.get(subject)
    resumed = earlier if earlier is not None and earlier.status != "done" else None
    if resumed is not None:
        report(f"resuming the forget of {subject!r} requested at "
               f"{resumed.requested_at.isoformat()} (it stopped after status {resumed.status!r})")
    request = Request(subject, "requested",
                      resumed.requested_at if resumed is not None else _now(),
                      resumed.key_deleted if resumed is not None else False)
    journal.put(request)
    report(f"recorded the request in {FORGET_TABLE}" if isinstance(journal, CassandraForgetJournal)
           else "recorded the request (in this process's memory: the keys are not in Cassandra)")
    _pause("record", report)

    deleted = store.forget(subject)
    request = attrs.evolve(request, status="key_deleted", key_deleted=request.key_deleted or deleted)
    journal.put(request)
    report("key deleted" if deleted else
           "key deleted before, by the run that stopped" if request.key_deleted else
           "no key to delete (forgotten before, or never seen)")
    _pause("key", report)

    rows = 0
    for step in steps:
        rows += step(cfg, app, subject, store, report)
    journal.put(attrs.evolve(request, status="rewritten"), rows)
    _pause("rewrite", report)
    journal.put(attrs.evolve(request, status="done"), rows)
    return ForgetOutcome(subject, deleted, resumed, rows)
