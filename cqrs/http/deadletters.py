"""``/dead-letters``: the letters the retry job records, as ``cqrs dlq`` shows and acts on them
(list with counts, a letter's history, retry, park, purge)."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from cqrs.http.context import HttpContext

__all__ = ["routes"]


def routes(ctx: HttpContext) -> APIRouter:
    from cqrs.topics import topics_for

    router = APIRouter(prefix="/dead-letters", tags=["dead letters"])
    topics = topics_for(ctx.app.name, ctx.cfg.kafka.topic_prefix)
    held: dict[str, Any] = {}
    lock = threading.Lock()

    def store() -> Any:  # opened on first use: the service starts without Cassandra
        from cqrs.retrier.store import RetryStore

        with lock:
            if "store" not in held:
                held["store"] = RetryStore(ctx.cfg, topics.base)
            return held["store"]

    def unknown(exc: Exception) -> JSONResponse:
        return JSONResponse({"error": type(exc).__name__, "message": str(exc)}, status_code=404)

    @router.get("", summary="letters (default: waiting or parked) with counts per state")
    async def list_(state: str = Query("open", description="waiting, parked, done, open "
                                       "(waiting or parked) or all"),
                    command_type: str | None = None, error_type: str | None = None,
                    older_than: str | None = Query(None, description="e.g. 30s, 15m, 2h, 1d")) -> Any:
        import attrs

        from cqrs.retrier.operators import list_letters
        from cqrs.retrier.plan import LetterFilter, parse_age

        flt = LetterFilter(state=None if state == "all" else state, command_type=command_type,
                           error_type=error_type,
                           older_than_s=parse_age(older_than) if older_than else None)
        listing = await run_in_threadpool(lambda: list_letters(store(), flt))
        return {"counts": listing.counts, "letters": [attrs.asdict(r) for r in listing.letters]}

    @router.get("/{command_id}", summary="a letter's history and the outcome of each retry")
    async def show(command_id: str) -> Any:
        from cqrs.retrier.operators import UnknownLetterError, letter_history

        try:
            return await run_in_threadpool(
                lambda: letter_history(ctx.cfg, ctx.app, topics, store(), command_id))
        except UnknownLetterError as exc:
            return unknown(exc)

    def action(name: str, run: Any, command_id: str) -> Any:
        from cqrs.retrier.operators import UnknownLetterError

        try:
            lines = run(ctx.cfg, topics, store(), [command_id])
        except UnknownLetterError as exc:
            return unknown(exc)
        return {"command_id": command_id, "action": name, "result": lines[0]}

    @router.post("/{command_id}/retry", summary="retry now (waiting: due now; parked: sent "
                 "again under a derived id)")
    async def retry(command_id: str) -> Any:
        from cqrs.retrier.operators import retry_letters

        return await run_in_threadpool(lambda: action("retry", retry_letters, command_id))

    @router.post("/{command_id}/park", summary="stop retrying a waiting letter")
    async def park(command_id: str) -> Any:
        from cqrs.retrier.operators import park_letters

        return await run_in_threadpool(lambda: action("park", park_letters, command_id))

    @router.delete("/{command_id}", summary="forget a letter (its row and history)")
    async def purge(command_id: str) -> Any:
        from cqrs.retrier.operators import purge_letters

        n = await run_in_threadpool(lambda: purge_letters(store(), [command_id]))
        return {"command_id": command_id, "action": "purge", "purged": n}

    return router
