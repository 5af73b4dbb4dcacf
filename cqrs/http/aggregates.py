"""``/aggregates/{id}``: an aggregate's current version and state (the aggregate-state table), and
``/aggregates/{id}/deadlines``: what it scheduled that has not fired (the scheduler's table)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from cqrs.client.json_commands import to_jsonable
from cqrs.http.context import HttpContext

__all__ = ["routes"]


def routes(ctx: HttpContext) -> APIRouter:
    router = APIRouter(prefix="/aggregates", tags=["aggregates"])

    @router.get("/{aggregate_id}", summary="an aggregate's version and state")
    async def get_state(aggregate_id: str,
                        type: str | None = Query(None, description="aggregate type name, when "  # noqa: A002
                                                 "the id exists under several types"),
                        version: int | None = Query(None, ge=0, description="wait until the "
                                                    "aggregate is at this version or later "
                                                    "(read-your-writes)"),
                        timeout: float = Query(10.0, gt=0, le=3600, description="seconds to wait "
                                               "for `version`")) -> Any:
        if type is not None and type not in ctx.app.model.aggregates:
            return JSONResponse({"error": "UnknownAggregateType", "message":
                                 f"aggregate type {type!r} is not in app {ctx.app.name!r}; "
                                 f"known: {sorted(ctx.app.model.aggregates)}"}, status_code=404)
        state = await run_in_threadpool(lambda: ctx.states.get(
            aggregate_id, type, min_version=version, timeout=timeout))
        if state is None:
            return JSONResponse({"error": "UnknownAggregate", "message":
                                 f"no aggregate {aggregate_id!r} in the processor's state (not "
                                 "created yet, or the processor has not run)"}, status_code=404)
        return to_jsonable(state)

    @router.get("/{aggregate_id}/deadlines",
                summary="the deadlines an aggregate scheduled that have not fired, earliest first")
    async def get_deadlines(aggregate_id: str,
                            type: str | None = Query(None, description="aggregate type name "  # noqa: A002
                                                     "(default: every type of the app)")) -> Any:
        from cqrs.scheduler.records import deadline_json
        from cqrs.scheduler.store import pending_deadlines

        if type is not None and type not in ctx.app.model.aggregates:
            return JSONResponse({"error": "UnknownAggregateType", "message":
                                 f"aggregate type {type!r} is not in app {ctx.app.name!r}; "
                                 f"known: {sorted(ctx.app.model.aggregates)}"}, status_code=404)
        found = await run_in_threadpool(lambda: pending_deadlines(
            ctx.cfg, ctx.app, aggregate_id, type, store=ctx.deadlines))
        return [deadline_json(d) for d in found]

    return router
