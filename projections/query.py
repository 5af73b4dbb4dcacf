"""``ProjectionReader``: the synchronous query API over a projection store.

>>> reader = ProjectionReader(app, store)
>>> reader.get("balances", "acc-1")                    # {"account_id": "acc-1", "owner": ...} or None
>>> page = reader.category("accounts_by_owner", "ann", page_size=10)
>>> page.items, page.next_token                         # newest first; pass next_token for more
>>> reader.wait_for("balances", "acc-1", version=3, timeout=5.0)   # read your writes

Readers always use the projection's *current* generation; during a rebuild that is the old one,
and after the switch a reader moves to the new one (a reader that raced a dropped table retries
once on the new generation), so queries keep answering throughout.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import attrs

from cqrs.personal.keys import KeyStore

from projections.errors import GenerationError, PageTokenError, WaitTimeoutError
from projections.model import CategoryProjection, Projection, find_projection
from projections.personal import with_personal_columns
from projections.store import ProjectionStore, table_base

__all__ = ["Page", "ProjectionReader"]

T = TypeVar("T")


@attrs.frozen
class Page:
    """One page of a category, newest first; ``next_token`` is None on the last page."""

    items: list[dict[str, Any]]
    next_token: str | None


def _sort_text(kind: type, value: Any) -> Any:
    if kind is _dt.datetime or kind is _dt.date:
        return value.isoformat()
    if kind is bytes:
        return value.hex()
    return value


def _sort_value(kind: type, text: Any) -> Any:
    if kind is _dt.datetime:
        return _dt.datetime.fromisoformat(text)
    if kind is _dt.date:
        return _dt.date.fromisoformat(text)
    if kind is bytes:
        return bytes.fromhex(text)
    return kind(text)


class ProjectionReader:
    """Queries of an app's projections. Thread-safe; one per process is enough.

    ``generation_ttl``: seconds a looked-up current generation is reused before asking again.
    Personal columns (``Projection.personal_columns``) are opened with ``key_store`` (default:
    the app's own, ``app.key_store``; on the stack pass
    ``cqrs.personal.key_store_for(cfg, app)``, or a store from
    :func:`projections.personal.stack_store`): once their subject is forgotten they read as
    ``FORGOTTEN``.
    """

    def __init__(self, app: Any, store: ProjectionStore, *, generation_ttl: float = 1.0,
                 key_store: KeyStore | None = None) -> None:
        self.app = app
        self.store = with_personal_columns(store, app, key_store)
        self.generation_ttl = generation_ttl
        self._generations: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    # --- generations ---------------------------------------------------------------------------

    def _target(self, name: str, refresh: bool = False) -> tuple[Projection, str, int]:
        projection = find_projection(self.app, name)
        base = table_base(self.app.name, name)
        now = time.monotonic()
        with self._lock:
            cached = self._generations.get(base)
        if cached is None or refresh or now - cached[0] > self.generation_ttl:
            current = self.store.generations(base).current
            if current is None:
                raise GenerationError(
                    f"projection {name!r} of app {self.app.name!r} has no tables yet: start "
                    f"`cqrs run projector <app> {name}` (or `cqrs rebuild`) first"
                )
            with self._lock:
                self._generations[base] = (now, current)
            return projection, base, current
        return projection, base, cached[1]

    def _read(self, name: str, fn: Callable[[Projection, str, int], T]) -> T:
        projection, base, generation = self._target(name)
        try:
            return fn(projection, base, generation)
        except Exception:
            # the generation may have been switched and dropped under us: retry once, fresh
            projection, base, fresh = self._target(name, refresh=True)
            if fresh == generation:
                raise
            return fn(projection, base, fresh)

    # --- queries -------------------------------------------------------------------------------

    def get(self, projection: str, key: str) -> dict[str, Any] | None:
        """The view of ``key`` (an aggregate id) as ``{key column: key, column: value...}``."""
        def read(p: Projection, base: str, gen: int) -> dict[str, Any] | None:
            stored = self.store.view(p, base, gen, key)
            if stored is None or not stored.visible or stored.values is None:
                return None
            return {p.key: key, **stored.values}
        return self._read(projection, read)

    def version(self, projection: str, aggregate_id: str) -> int | None:
        """The aggregate version the projection has applied (None: nothing applied yet)."""
        def read(p: Projection, base: str, gen: int) -> int | None:
            stored = self.store.view(p, base, gen, aggregate_id)
            return stored.version if stored is not None and stored.version > 0 else None
        return self._read(projection, read)

    def category(self, projection: str, group: str, *, page_size: int = 20,
                 page_token: str | None = None) -> Page:
        """Items of ``group``, newest first, ``page_size`` at a time (at most ``keep`` in all)."""
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        p = find_projection(self.app, projection)
        if not isinstance(p, CategoryProjection):
            raise GenerationError(
                f"projection {projection!r} is not a CategoryProjection: use get() for it")
        kind = p.columns[p.order_by]
        after = self._decode_token(projection, group, kind, page_token)

        def read(p: Projection, base: str, gen: int) -> Page:
            assert isinstance(p, CategoryProjection)
            rows = [r for r in self.store.category_rows(p, base, gen, group, p.keep) if not r.deleted]
            if after is not None:
                rows = [r for r in rows if r.sort < after[0]
                        or (r.sort == after[0] and r.aggregate_id > after[1])]
            page = rows[:page_size]
            items = [{p.key: r.aggregate_id, **(r.values or {})} for r in page]
            token = None
            if len(rows) > page_size:
                last = page[-1]
                raw = json.dumps({"p": projection, "g": group, "s": _sort_text(kind, last.sort),
                                  "a": last.aggregate_id}).encode()
                token = base64.urlsafe_b64encode(raw).decode()
            return Page(items, token)
        return self._read(projection, read)

    def pages(self, projection: str, group: str, *, page_size: int = 20) -> Iterator[Page]:
        """Every page of ``group``, newest first, following the page tokens."""
        token: str | None = None
        while True:
            page = self.category(projection, group, page_size=page_size, page_token=token)
            yield page
            token = page.next_token
            if token is None:
                return

    @staticmethod
    def _decode_token(projection: str, group: str, kind: type,
                      token: str | None) -> tuple[Any, str] | None:
        if token is None:
            return None
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            if data["p"] != projection or data["g"] != group:
                raise ValueError("other projection or group")
            return _sort_value(kind, data["s"]), str(data["a"])
        except (ValueError, KeyError, TypeError) as exc:
            raise PageTokenError(
                f"page token {token!r} is not a token of projection {projection!r}, group "
                f"{group!r} ({exc}); start again without a token"
            ) from None

    def wait_for(self, projection: str, aggregate_id: str, version: int, timeout: float = 5.0,
                 *, poll: float = 0.05) -> int:
        """Block until ``projection`` has applied ``version`` of ``aggregate_id``; return the
        applied version. Raises :class:`~projections.errors.WaitTimeoutError` after ``timeout``
        seconds (it names the projection, aggregate, awaited and seen versions)."""
        deadline = time.monotonic() + timeout
        seen: int | None = None
        while True:
            try:
                seen = self.version(projection, aggregate_id)
            except GenerationError:
                seen = None
            if seen is not None and seen >= version:
                return seen
            if time.monotonic() >= deadline:
                raise WaitTimeoutError(projection, aggregate_id, version, seen, timeout)
            time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
