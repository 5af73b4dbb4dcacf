"""``/commands``: list the command types, send a command (and wait), fetch a result later."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from cqrs.client.command_client import check_ids
from cqrs.client.errors import CommandTimeoutError
from cqrs.client.json_commands import command_fields, command_from_json, to_jsonable
from cqrs.client.replies import ResultFuture
from cqrs.http.context import HttpContext
from cqrs.http.errors import error_body

__all__ = ["SendRequest", "routes"]


class SendRequest(BaseModel):
    aggregate_id: str = Field(description="the aggregate the command is for (its Kafka key)")
    data: dict[str, Any] = Field(default_factory=dict, description="the command's fields")
    expected_version: int | None = Field(
        default=None, description="null: any; 0: must be new; n: must be exactly at n")
    command_id: str | None = Field(default=None, description="idempotency key (default: random)")
    correlation_id: str | None = None


def _result_json(result: Any) -> dict[str, Any]:
    body: dict[str, Any] = to_jsonable(result)
    body["accepted"] = result.accepted
    return body


async def _await_result(ctx: HttpContext, future: ResultFuture, timeout: float) -> JSONResponse:
    try:
        result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
    except TimeoutError:  # the future stays in ctx.recent: GET .../result can pick it up later
        exc = CommandTimeoutError(future.command_id, future.aggregate_id, timeout)
        return JSONResponse(error_body(exc, result_url=f"/commands/{future.command_id}/result"),
                            status_code=504)
    return JSONResponse(_result_json(result))


def routes(ctx: HttpContext) -> APIRouter:
    router = APIRouter(prefix="/commands", tags=["commands"])
    default_timeout = ctx.cfg.client.timeout_s

    @router.get("", summary="the app's command types and their JSON fields")
    def list_commands() -> dict[str, Any]:
        return {name: {"fields": command_fields(cls)}
                for name, cls in sorted(ctx.app.model.commands.items())}

    @router.post("/{command_type}", summary="send a command; wait for its result unless wait=false",
                 responses={202: {"description": "sent, not waited for"},
                            504: {"description": "no result in time; resend with the same command_id"}})
    async def send(command_type: str, body: SendRequest,
                   wait: bool = Query(True, description="wait for the result"),
                   timeout: float = Query(default_timeout, gt=0, le=3600,
                                          description="seconds to wait")) -> JSONResponse:
        command = command_from_json(ctx.app, command_type, body.data)
        check_ids(body.aggregate_id, body.command_id, body.correlation_id, body.expected_version)
        client = ctx.client if ctx.has_client() else await run_in_threadpool(lambda: ctx.client)
        future = client.send(body.aggregate_id, command, body.expected_version, body.command_id,
                             body.correlation_id)
        ctx.recent.add(future)
        if not wait:
            return JSONResponse({"command_id": future.command_id,
                                 "result_url": f"/commands/{future.command_id}/result"},
                                status_code=202)
        return await _await_result(ctx, future, timeout)

    @router.get("/{command_id}/result", summary="the result of a command sent through this service")
    async def result(command_id: str,
                     timeout: float = Query(default_timeout, gt=0, le=3600)) -> JSONResponse:
        future = ctx.recent.get(command_id)
        if future is None:
            return JSONResponse({"error": "UnknownCommandId", "command_id": command_id,
                                 "message": f"command {command_id!r} was not sent through this "
                                 "service (or long ago): resend it with the same command_id, "
                                 "the processor answers it once"}, status_code=404)
        return await _await_result(ctx, future, timeout)

    return router
