"""``/conversations/{correlation_id}``: wait for the end of a conversation between aggregates
(the outcome a process manager records; see :mod:`cqrs.client.conversations`)."""

from __future__ import annotations

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from cqrs.client.conversations import ConversationTimeoutError, outcome_json
from cqrs.http.context import HttpContext
from cqrs.http.errors import error_body

__all__ = ["MAX_WAIT_S", "routes"]

MAX_WAIT_S = 300.0  # a request holds a thread while it waits (the service's client's
# outcome watcher, one consumer for every request, hands it the outcome when it is written)


def routes(ctx: HttpContext) -> APIRouter:
    router = APIRouter(prefix="/conversations", tags=["conversations"])
    default_timeout = ctx.cfg.client.timeout_s

    @router.get("/{correlation_id}",
                summary="wait for the event that ends a conversation (process managers)",
                responses={504: {"description": "the conversation did not end in time"}})
    async def wait(correlation_id: str,
                   timeout: float = Query(min(default_timeout, MAX_WAIT_S), gt=0, le=MAX_WAIT_S,
                                          description="seconds (at most 300)"),
                   since: float = Query(3600.0, ge=0, description="look back this many seconds "
                                        "for an outcome written before the call")) -> JSONResponse:
        try:
            outcome, event = await run_in_threadpool(
                ctx.client.wait_conversation, correlation_id, timeout=timeout, since_s=since)
        except ConversationTimeoutError as exc:
            return JSONResponse(error_body(exc), status_code=504)
        return JSONResponse(outcome_json(outcome, event))

    return router
