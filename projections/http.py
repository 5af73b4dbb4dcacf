"""``/projections``: the app's read models over HTTP, added to ``cqrs serve`` when the app has
projections (``routes`` is a route factory, see :mod:`cqrs.http.app`).

- ``GET /projections``: the projections, their kind, key and columns;
- ``GET /projections/{name}/{key}?version=N&timeout=S``: one view; with ``version``, first wait
  (up to ``timeout`` seconds) until the projection has applied that version of the aggregate:
  read-your-writes after a command answered ``accepted`` with that version;
- ``GET /projections/{name}/groups/{group}?page_size=20&page_token=...``: a category's items,
  newest first, a page at a time.
"""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from cqrs.client.json_commands import to_jsonable
from cqrs.http.context import HttpContext
from cqrs.domain.messages import type_name
from cqrs.http.errors import error_body
from projections.errors import GenerationError, UnknownProjectionError, WaitTimeoutError
from projections.model import CategoryProjection, Projection, RekeyedProjection, projections_of
from projections.query import ProjectionReader

__all__ = ["describe", "routes"]


def describe(projection: Projection) -> dict[str, Any]:
    """What a client needs to know about a projection to query it."""
    out: dict[str, Any] = {
        "name": projection.name,
        "kind": ("category" if isinstance(projection, CategoryProjection)
                 else "rekeyed" if isinstance(projection, RekeyedProjection) else "view"),
        "key": projection.key,
        "columns": {c: t.__name__ for c, t in projection.columns.items()},
    }
    if isinstance(projection, CategoryProjection):
        out.update(group_by=projection.group_by, order_by=projection.order_by, keep=projection.keep)
    if isinstance(projection, RekeyedProjection):  # keyed by key_of(event), not the aggregate id
        out.update(source_aggregate=type_name(projection.aggregate))
    return out


def _error(exc: Exception, status: int) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=status)


def routes(ctx: HttpContext) -> APIRouter:
    router = APIRouter(prefix="/projections", tags=["projections"])
    lock = threading.Lock()
    readers: list[ProjectionReader] = []

    def reader() -> ProjectionReader:
        with lock:  # opened on first use: a bad request never touches the store
            if not readers:
                from projections.stores import cached_store

                from projections.personal import stack_store

                readers.append(ProjectionReader(
                    ctx.app, stack_store(cached_store(ctx.cfg), ctx.cfg, ctx.app)))
            return readers[0]

    def known(name: str) -> Projection:
        found = projections_of(ctx.app).get(name)
        if found is None:
            raise UnknownProjectionError(
                f"projection {name!r} is not in app {ctx.app.name!r}; known: "
                f"{sorted(projections_of(ctx.app))}")
        return found

    @router.get("", summary="the app's projections")
    async def list_projections() -> Any:
        return [describe(p) for p in projections_of(ctx.app).values()]

    @router.get("/{name}/groups/{group}", summary="a category's items, newest first, paged")
    async def get_group(name: str, group: str,
                        page_size: int = Query(20, ge=1, le=1000),
                        page_token: str | None = Query(None)) -> Any:
        try:
            if not isinstance(known(name), CategoryProjection):
                return JSONResponse({"error": "NotACategory", "message":
                                     f"projection {name!r} is not a category projection: read its "
                                     f"views at /projections/{name}/{{key}}"}, status_code=400)
            page = await run_in_threadpool(
                lambda: reader().category(name, group, page_size=page_size, page_token=page_token))
        except UnknownProjectionError as exc:
            return _error(exc, 404)
        except GenerationError as exc:
            return _error(exc, 503)
        return {"items": to_jsonable(page.items), "next_page_token": page.next_token}

    @router.get("/{name}/{key}", summary="one view; with version=N, after the projection "
                "applied version N of the aggregate (read-your-writes)")
    async def get_view(name: str, key: str,
                       version: int | None = Query(None, ge=1, description="wait until this "
                                                   "aggregate version is applied"),
                       timeout: float = Query(5.0, gt=0, le=60)) -> Any:
        try:
            known(name)
            if version is not None:
                await run_in_threadpool(lambda: reader().wait_for(name, key, version, timeout))
            view = await run_in_threadpool(lambda: reader().get(name, key))
        except UnknownProjectionError as exc:
            return _error(exc, 404)
        except WaitTimeoutError as exc:
            return _error(exc, 504)
        except GenerationError as exc:
            return _error(exc, 503)
        if view is None:
            return JSONResponse({"error": "UnknownView", "message":
                                 f"projection {name!r} has no view for {key!r} (not created yet, "
                                 "deleted, or the projector is behind)"}, status_code=404)
        return to_jsonable(view)

    return router
