"""The HTTP service: a FastAPI app over the command client and the state reader.

Routes come from *route factories*, ``routes(ctx: HttpContext) -> APIRouter``: the built-in
ones (:func:`builtin_routes`) plus any given by the caller, e.g. projection read models added
with ``cqrs serve APP --routes projections.http:routes`` (the ``cqrs`` core never imports them).
OpenAPI documentation is served at ``/docs`` and ``/openapi.json``; the status page at ``/``,
its JSON at ``/status.json`` and Prometheus metrics at ``/metrics`` (:mod:`cqrs.http.status`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from cqrs.http.context import HttpContext, RouteFactory
from cqrs.http.status import ProbeFactory

__all__ = ["builtin_routes", "create_http_app"]


def builtin_routes() -> list[RouteFactory]:
    """The routes every service has: ``/commands``, ``/aggregates``, ``/conversations``,
    ``/dead-letters`` and ``/subjects`` (forgetting a data subject)."""
    from cqrs.http import aggregates, commands, conversations, deadletters, subjects

    return [commands.routes, aggregates.routes, conversations.routes, deadletters.routes,
            subjects.routes]


def create_http_app(ctx: HttpContext, extra_routes: Sequence[RouteFactory] = (), *,
                    status_probes: Sequence[ProbeFactory] = ()) -> Any:
    """A FastAPI app serving ``ctx.app``; ``extra_routes`` add routers (projections...),
    ``status_probes`` figures to the status page and metrics (projection positions...)."""
    from fastapi import FastAPI

    from cqrs.http.errors import install_error_handlers
    from cqrs.http.status import ServeStatus, status_router

    status = ServeStatus(ctx.app, ctx.cfg, status_probes)  # reads Kafka on first request only

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            status.close()
            ctx.close()  # flush the producer, stop the listener and Spark

    api = FastAPI(title=f"cqrs: {ctx.app.name}", lifespan=lifespan,
                  description="Send commands, wait for their results, read aggregate state.")
    install_error_handlers(api)

    @api.get("/health", tags=["service"])
    def health() -> dict[str, str]:
        return {"app": ctx.app.name, "status": "ok"}

    for factory in [*builtin_routes(), *extra_routes]:
        api.include_router(factory(ctx))
    api.include_router(status_router(status))
    return api
