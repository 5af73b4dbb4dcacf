"""The HTTP service of an app (FastAPI): send commands, wait for results, read aggregate state."""

from __future__ import annotations

from cqrs.http.app import builtin_routes, create_http_app
from cqrs.http.context import HttpContext, RecentCommands, RouteFactory

__all__ = ["HttpContext", "RecentCommands", "RouteFactory", "builtin_routes", "create_http_app"]
