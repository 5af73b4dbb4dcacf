"""``/subjects/{subject}/forget``: forget a data subject (delete their key: crypto-shredding),
as ``cqrs forget`` does.

200 with ``{"app", "subject", "status", "rows_rewritten", "message"}``, ``status``
``"forgotten"`` (the key was deleted now, or by an interrupted forget this one finished) or
``"unknown"`` (there was none: forgotten before, or never seen), so a request
retried after a lost answer succeeds too; 404 ``NoPersonalDataError`` for an app without
``personal()`` fields; 422 ``InvalidSubjectError`` for an empty subject."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from cqrs.http.context import HttpContext

__all__ = ["routes"]


def routes(ctx: HttpContext) -> APIRouter:
    router = APIRouter(prefix="/subjects", tags=["personal data"])

    @router.post("/{subject:path}/forget",
                 summary="forget a data subject: delete their key, so their personal fields "
                 "read as their replacement everywhere (idempotent)",
                 responses={404: {"description": "the app declares no personal() fields"},
                            422: {"description": "an empty subject"}})
    async def forget(subject: str) -> dict[str, Any]:
        from cqrs.personal.stack import check_subject_id, describe_forget, forget

        check_subject_id(subject)
        outcome = await run_in_threadpool(
            lambda: forget(ctx.cfg, ctx.app, subject, steps=ctx.forget_steps))
        return {"app": ctx.app.name, "subject": subject,
                "status": "forgotten" if outcome.forgotten else "unknown",
                "rows_rewritten": outcome.rows_rewritten,
                "message": describe_forget(ctx.cfg, ctx.app, subject, outcome)}

    return router
