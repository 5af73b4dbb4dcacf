"""``/aggregates/{id}``: an aggregate's current version and state (the aggregate-state table), or
its state at a version or a time (the history table); ``/aggregates/{id}/events``: its events (the
history table); and ``/aggregates/{id}/deadlines``: what it scheduled that has not fired (the scheduler's table)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from cqrs.client.json_commands import to_jsonable
from cqrs.collector import paused
from cqrs.http.context import HttpContext
from cqrs.http.fast_json import FastJSONResponse

__all__ = ["routes"]


def routes(ctx: HttpContext) -> APIRouter:
    router = APIRouter(prefix="/aggregates", tags=["aggregates"])

    def unknown_type(type: str | None) -> JSONResponse | None:  # noqa: A002
        if type is not None and type not in ctx.app.model.aggregates:
            return JSONResponse({"error": "UnknownAggregateType", "message":
                                 f"aggregate type {type!r} is not in app {ctx.app.name!r}; "
                                 f"known: {sorted(ctx.app.model.aggregates)}"}, status_code=404)
        return None

    @router.get("/{aggregate_id}", summary="an aggregate's version and state: now, or as it was "
                "at a version or a time")
    async def get_state(aggregate_id: str,
                        type: str | None = Query(None, description="aggregate type name, when "  # noqa: A002
                                                 "the id exists under several types"),
                        wait_for_version: int | None = Query(
                            None, ge=0, description="wait until the aggregate is at this version "
                            "or later, then answer its current state (read-your-writes)"),
                        version: int | None = Query(None, ge=0, deprecated=True, description=(
                            "deprecated spelling of `wait_for_version` (it never meant the state "
                            "at a version: that is `at_version`)")),
                        timeout: float = Query(10.0, gt=0, le=3600, description="seconds to wait "
                                               "for `wait_for_version`"),
                        at_version: int | None = Query(None, description="the state as it was "
                                                       "at this version (from the history)"),
                        at: str | None = Query(None, description="the state as it was at this "
                                               "time (ISO-8601 with a UTC offset): after the last "
                                               "event recorded by then")) -> Any:
        if (bad := unknown_type(type)) is not None:
            return bad
        if at_version is not None or at is not None:
            return await past_state(aggregate_id, type, at_version, at,
                                    wait_for_version if wait_for_version is not None else version)
        wait = wait_for_version if wait_for_version is not None else version
        state = await run_in_threadpool(lambda: ctx.states.get(
            aggregate_id, type, min_version=wait, timeout=timeout))
        if state is None:
            return JSONResponse({"error": "UnknownAggregate", "message":
                                 f"no aggregate {aggregate_id!r} in the processor's state (not "
                                 "created yet, or the processor has not run)"}, status_code=404)
        return to_jsonable(state)

    async def past_state(aggregate_id: str, type: str | None, at_version: int | None,  # noqa: A002
                         at: str | None, wait: int | None) -> Any:
        from cqrs.history import HistoryRequestError

        if at_version is not None and at is not None:
            raise HistoryRequestError("give at_version or at, not both")
        if wait is not None:
            raise HistoryRequestError("wait_for_version waits for the current state; it does "
                                      "not go with at_version / at")
        when = None
        if at is not None:
            from cqrs.history.forms import parse_time

            when = parse_time(at)
        state = await run_in_threadpool(lambda: ctx.history.state_at(
            aggregate_id, type, version=at_version, at=when))
        if state is None:
            return JSONResponse({"error": "UnknownAggregate", "message":
                                 f"no history for aggregate {aggregate_id!r} (not created yet, "
                                 "or the history job has not run: `cqrs run history`)"},
                                status_code=404)
        return to_jsonable(state)

    @router.get("/{aggregate_id}/events",
                summary="an aggregate's events in version order, with their envelopes, a page "
                "at a time")
    async def get_events(aggregate_id: str,
                         type: str | None = Query(None, description="aggregate type name, when "  # noqa: A002
                                                  "the id exists under several types"),
                         from_version: int | None = Query(None, ge=1, description="the first "
                                                          "version (default 1; or page_token)"),
                         limit: int = Query(100, ge=1, le=10_000, description="events per page"),
                         page_token: str | None = Query(None, description="the previous page's "
                                                        "next_page_token")) -> Any:
        from cqrs.history.forms import event_json

        if (bad := unknown_type(type)) is not None:
            return bad
        def page_response() -> JSONResponse:
            """Read, convert and render (plain JSON values already, as they are; orjson) in a
            worker thread: milliseconds of CPU for 1,000 events that would otherwise hold the
            event loop."""
            page = ctx.history.events(aggregate_id, type, from_version=from_version, limit=limit,
                                      page_token=page_token)
            with paused():
                return FastJSONResponse({"aggregate_id": aggregate_id,
                                         "events": [event_json(e, text_times=False)
                                                    for e in page.events],
                                         "next_page_token": page.next_page_token})

        return await run_in_threadpool(page_response)

    @router.get("/{aggregate_id}/deadlines",
                summary="the deadlines an aggregate scheduled that have not fired, earliest first")
    async def get_deadlines(aggregate_id: str,
                            type: str | None = Query(None, description="aggregate type name "  # noqa: A002
                                                     "(default: every type of the app)")) -> Any:
        from cqrs.scheduler.records import deadline_json
        from cqrs.scheduler.store import pending_deadlines

        if (bad := unknown_type(type)) is not None:
            return bad
        found = await run_in_threadpool(lambda: pending_deadlines(
            ctx.cfg, ctx.app, aggregate_id, type, store=ctx.deadlines))
        return [deadline_json(d) for d in found]

    return router
