"""Errors as JSON ``{"error": type, "message": text, ...}`` with a 4xx status for bad requests
(413 for a command over Kafka's record limit, with its ``size`` and the ``limit`` in bytes; 422
for malformed data and ids, an aggregate id too long for its state row among them); 503 when
the service cannot answer (Kafka or Cassandra unreachable, a setting missing, e.g. the master
key of personal data); a bug is a 500 with its type and message, never a traceback."""

from __future__ import annotations

import logging
from typing import Any

from cqrs.client.errors import (
    CommandDataError,
    CommandTimeoutError,
    InvalidAggregateIdError,
    InvalidCommandIdError,
    UnknownCommandTypeError,
)
from cqrs.errors import (
    CqrsError,
    InvalidSubjectError,
    MissingMasterKeyError,
    NoPersonalDataError,
    RecordTooLargeError,
)

__all__ = ["error_body", "install_error_handlers", "status_of"]

log = logging.getLogger("cqrs.http")


def status_of(exc: BaseException) -> int:
    """The HTTP status of a framework error."""
    from cqrs.history.rows import HistoryRangeError
    from cqrs.processor.state import StateReadError, StateTimeoutError

    if isinstance(exc, (UnknownCommandTypeError, HistoryRangeError, NoPersonalDataError)):
        return 404
    if isinstance(exc, RecordTooLargeError):  # a command over Kafka's record limit
        return 413
    if isinstance(exc, (CommandDataError, InvalidAggregateIdError, InvalidCommandIdError,
                        InvalidSubjectError)):
        return 422
    if isinstance(exc, MissingMasterKeyError):  # the service's configuration, not the request
        return 503
    if isinstance(exc, (CommandTimeoutError, StateTimeoutError)):
        return 504
    if isinstance(exc, StateReadError):
        return 503
    if isinstance(exc, (ValueError, LookupError, TypeError)):
        return 400
    return 503  # Kafka or Spark unreachable and the like: try again later


def error_body(exc: BaseException, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    for attr in ("field", "command_id", "size", "limit"):
        value = getattr(exc, attr, None)
        if value is not None:
            body[attr] = value
    body.update(extra)
    return body


def install_error_handlers(api: Any) -> None:
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    @api.exception_handler(CqrsError)
    async def _framework(_: Request, exc: CqrsError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=status_of(exc))

    @api.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e.get("loc", ()))
            problems.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
        return JSONResponse({"error": "RequestValidationError",
                             "message": "bad request: " + "; ".join(problems)}, status_code=422)

    @api.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error in the cqrs HTTP service")
        lines = str(exc).strip().splitlines()  # the first line: no (Java) stack trace
        return JSONResponse({"error": type(exc).__name__, "message": lines[0] if lines else ""},
                            status_code=500)
