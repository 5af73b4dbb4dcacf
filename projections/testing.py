"""Projections of the example bank (``cqrs.testing.example``), for tests, docs and benchmarks,
and a small library whose loans move between members (categories with moving items).

``app`` is the bank with these projections, importable by Spark executors as
``projections.testing:app``; ``library_app`` is the library (``projections.testing:library_app``).
"""

from __future__ import annotations

import datetime as _dt
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cqrs.app import App
from cqrs.domain import Aggregate, event
from cqrs.domain.messages import type_name
from cqrs.testing.example import (
    Account,
    AccountClosed,
    AccountHandler,
    AccountOpened,
    Deposited,
    Withdrawn,
)
from projections.local import aggregate_type_of
from projections.model import DELETE, CategoryProjection, Delete, EventMeta, Projection, RekeyedProjection

__all__ = ["POISON_FILE", "AccountsByOwner", "Balances", "Book", "BookLent", "BookReturned",
           "BooksByHolder", "LoanTransferred", "LoansByMember", "MovementsByBand", "app",
           "library_app", "make_bank_app", "make_library_app", "make_rekeyed_app", "produce_events",
           "publish_schemas", "rekeyed_app"]

_NS = uuid.UUID("6f1c2b1e-8a47-4f44-9d1e-3c5b8f0a7e21")

POISON_FILE = Path(tempfile.gettempdir()) / "cqrs-projections-poison-amounts"
"""Deposits of an amount listed in this file (one per line) make :class:`Balances` fail: lets
tests poison a handler and fix it again across processes."""


_poison_cache: list[Any] = [None, frozenset()]  # (file signature, amounts)


def _poisoned(amount: int | str) -> bool:
    """Whether the amount (or name) is listed in POISON_FILE (re-read only when the file
    changes)."""
    import os

    try:
        st = os.stat(POISON_FILE)
        signature: Any = (st.st_mtime_ns, st.st_size, st.st_ino)
    except FileNotFoundError:
        signature = None
    if signature != _poison_cache[0]:
        amounts = frozenset(POISON_FILE.read_text().split()) if signature else frozenset()
        _poison_cache[:] = [signature, amounts]
    return str(amount) in _poison_cache[1]


class Balances(Projection):
    """One row per account: owner, balance, number of movements; deleted when closed."""

    name = "balances"
    aggregate = Account
    key = "account_id"
    columns = {"owner": str, "balance": int, "movements": int, "updated_at": _dt.datetime}
    defaults = {"balance": 0, "movements": 0}

    def on_opened(self, view: dict, event: AccountOpened, meta: EventMeta) -> None:
        view["owner"] = event.owner
        view["updated_at"] = meta.timestamp

    def on_deposited(self, view: dict, event: Deposited, meta: EventMeta) -> None:
        if _poisoned(event.amount):
            raise ValueError(f"poisoned deposit amount {event.amount}")
        view["balance"] += event.amount
        view["movements"] += 1
        view["updated_at"] = meta.timestamp

    def on_withdrawn(self, view: dict, event: Withdrawn, meta: EventMeta) -> None:
        view["balance"] -= event.amount
        view["movements"] += 1
        view["updated_at"] = meta.timestamp

    def on_closed(self, view: dict, event: AccountClosed) -> Delete:
        return DELETE


class AccountsByOwner(CategoryProjection):
    """An owner's newest accounts (the 3 last opened), with their balances."""

    name = "accounts_by_owner"
    aggregate = Account
    key = "account_id"
    columns = {"owner": str, "opened_at": _dt.datetime, "balance": int}
    defaults = {"balance": 0}
    group_by = "owner"
    order_by = "opened_at"
    keep = 3

    def on_opened(self, view: dict, event: AccountOpened, meta: EventMeta) -> None:
        view["owner"] = event.owner
        view["opened_at"] = meta.timestamp

    def on_moved(self, view: dict, event: Deposited | Withdrawn) -> None:
        view["balance"] += event.amount if isinstance(event, Deposited) else -event.amount


class MovementsByBand(RekeyedProjection):
    """Re-keyed: movements of every account per amount band (``band-0`` for 0-9, ``band-1`` for
    10-19, ...): how many, their total and the latest time. Deposits of a poisoned amount fail
    (like :class:`Balances`); movements of amount 0 are ignored (``key_of`` returns None)."""

    name = "movements_by_band"
    aggregate = Account
    key = "band"
    columns = {"movements": int, "total": int, "last_at": _dt.datetime}
    defaults = {"movements": 0, "total": 0}

    def key_of(self, event: Deposited | Withdrawn, meta: EventMeta) -> str | None:
        return f"band-{event.amount // 10}" if event.amount else None

    def on_moved(self, view: dict, event: Deposited | Withdrawn, meta: EventMeta) -> None:
        if isinstance(event, Deposited) and _poisoned(event.amount):
            raise ValueError(f"poisoned deposit amount {event.amount}")
        view["movements"] += 1
        view["total"] += event.amount
        view["last_at"] = max(view["last_at"] or meta.timestamp, meta.timestamp)


def make_rekeyed_app(name: str = "example-bank-rekeyed") -> App:
    """The example bank with a re-keyed projection (and the per-account balances)."""
    return App(name, aggregates=[Account], handlers=[AccountHandler],
               projections=[Balances, MovementsByBand])


def make_bank_app(name: str = "example-bank") -> App:
    return App(name, aggregates=[Account], handlers=[AccountHandler],
               projections=[Balances, AccountsByOwner])


# --- a library: loans that move between members ----------------------------------------------


@event(name="example.library.BookLent")
class BookLent:
    loan_id: str
    member: str


@event(name="example.library.LoanTransferred")
class LoanTransferred:
    """The loan goes on under another member (its item moves to that member's group)."""

    loan_id: str
    member: str


@event(name="example.library.BookReturned")
class BookReturned:
    loan_id: str


class Book(Aggregate, name="example.library.Book"):
    """A book: lent (under a loan id of its own) to one member at a time."""

    loan_id: str = ""
    member: str = ""

    def apply_book_lent(self, e: BookLent) -> None:
        self.loan_id, self.member = e.loan_id, e.member

    def apply_loan_transferred(self, e: LoanTransferred) -> None:
        self.member = e.member

    def apply_book_returned(self, e: BookReturned) -> None:
        self.loan_id = self.member = ""


LoanEvent = BookLent | LoanTransferred | BookReturned


class LoansByMember(RekeyedProjection, CategoryProjection):
    """Re-keyed category: one item per loan (``key_of``: the loan id of the books' events),
    grouped by member, newest loan first; a transferred loan moves to the new member's group,
    a returned one is deleted. A transfer to a member listed in :data:`POISON_FILE` fails."""

    name = "loans_by_member"
    aggregate = Book
    key = "loan_id"
    columns = {"member": str, "book": str, "lent_at": _dt.datetime, "transfers": int}
    defaults = {"transfers": 0}
    group_by = "member"
    order_by = "lent_at"
    keep = 3

    def key_of(self, event: LoanEvent, meta: EventMeta) -> str:
        return event.loan_id

    def on_lent(self, view: dict, event: BookLent, meta: EventMeta) -> None:
        view["member"], view["book"], view["lent_at"] = event.member, meta.aggregate_id, meta.timestamp

    def on_transferred(self, view: dict, event: LoanTransferred) -> None:
        if _poisoned(event.member):
            raise ValueError(f"poisoned member {event.member!r}")
        view["member"] = event.member
        view["transfers"] += 1

    def on_returned(self, view: dict, event: BookReturned) -> Delete:
        return DELETE


class BooksByHolder(CategoryProjection):
    """Category keyed by the aggregate: one item per book in the group of the member holding
    it, ordered by when the book was first lent; it moves on a transfer, leaves the category
    when returned (holder None) and comes back with the next loan."""

    name = "books_by_holder"
    aggregate = Book
    key = "book"
    columns = {"holder": str, "since": _dt.datetime, "loans": int}
    defaults = {"loans": 0}
    group_by = "holder"
    order_by = "since"
    keep = 3

    def on_lent(self, view: dict, event: BookLent, meta: EventMeta) -> None:
        view["holder"] = event.member
        view["since"] = view["since"] or meta.timestamp
        view["loans"] += 1

    def on_transferred(self, view: dict, event: LoanTransferred) -> None:
        view["holder"] = event.member

    def on_returned(self, view: dict, event: BookReturned) -> None:
        view["holder"] = None


def make_library_app(name: str = "example-library") -> App:
    """The library with both categories of moving items."""
    return App(name, aggregates=[Book], handlers=[], projections=[LoansByMember, BooksByHolder])


app = make_bank_app()
rekeyed_app = make_rekeyed_app()
library_app = make_library_app()


def produce_events(cfg: Any, topic: str, app: App, events: Iterable[tuple[str, object]], *,
                   versions: dict[str, int], start: _dt.datetime | None = None,
                   producer: Any = None) -> int:
    """Write events straight to the events topic with the real envelope and codec (versions
    counted per aggregate, continuing from ``versions``); returns how many. Publish the app's
    schemas first (``cqrs.processor.job.publish_app_schemas``) so readers can decode them."""
    from cqrs.envelope import Envelope, to_kafka
    from cqrs.kafka_io import make_producer

    own = producer is None
    producer = producer or make_producer(cfg, **{"linger.ms": 50, "batch.num.messages": 10000})
    t0 = start or _dt.datetime(2026, 6, 1, tzinfo=_dt.timezone.utc)
    encode = app.codec.encode
    aggregate_types: dict[str, str] = {}  # event type -> aggregate type
    n = 0
    for i, (aggregate_id, payload) in enumerate(events):
        version = versions.get(aggregate_id, 0) + 1
        versions[aggregate_id] = version
        message_type = type_name(payload)
        if message_type not in aggregate_types:
            aggregate_types[message_type] = aggregate_type_of(app, payload)
        env = Envelope(message_id=str(uuid.uuid5(_NS, f"{aggregate_id}/{version}")),
                       message_type=message_type, kind="event",
                       aggregate_type=aggregate_types[message_type],
                       aggregate_id=aggregate_id, timestamp=t0 + _dt.timedelta(milliseconds=i),
                       version=version)
        key, value, headers = to_kafka(env, encode(payload))
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
    if own and producer.flush(60) != 0:
        raise RuntimeError(f"events not delivered to {topic!r} within 60 s")
    return n


def publish_schemas(cfg: Any, topics: Any, app: App, attempts: int = 5) -> None:
    """``publish_app_schemas``, retried while a schemas topic created a moment ago has no
    partition leader yet (a fresh topic per test or benchmark run)."""
    import time

    from cqrs.errors import SchemaStoreError
    from cqrs.processor.job import publish_app_schemas

    for attempt in range(attempts):
        try:
            publish_app_schemas(cfg, topics, app)
            return
        except SchemaStoreError:
            if attempt == attempts - 1:
                raise
            time.sleep(2)
