"""History in the forms the CLI and the HTTP service share: an event as JSON, a time from text."""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any

from cqrs.history.rows import HistoryEvent, HistoryTimeError

__all__ = ["event_json", "parse_time"]


def event_json(e: HistoryEvent, *, text_times: bool = True) -> dict[str, Any]:
    """A :class:`~cqrs.history.HistoryEvent` as JSON (what ``GET /aggregates/{id}/events`` and
    ``cqrs history --json`` write): the envelope, and ``data``, the event's fields in the JSON
    forms of :func:`cqrs.client.to_jsonable`. The two times are ISO-8601 text; with
    ``text_times=False`` they stay timezone-aware datetimes, for a renderer that writes them as
    the same text itself (orjson does, ~40x cheaper than ``isoformat``)."""
    from cqrs.client.json_commands import to_jsonable

    return {"version": e.version, "event_id": e.event_id, "type": e.event_type,
            "timestamp": e.timestamp.isoformat() if text_times else e.timestamp,
            "recorded_at": e.recorded_at.isoformat() if text_times else e.recorded_at,
            "command_id": e.command_id, "correlation_id": e.correlation_id,
            "causation_id": e.causation_id, "schema_version": e.schema_version,
            "aggregate_type": e.aggregate_type, "aggregate_id": e.aggregate_id,
            "data": to_jsonable(e.event)}


def parse_time(text: str) -> _dt.datetime:
    """An ISO-8601 time with a UTC offset (``Z`` allowed), else :class:`HistoryTimeError`
    saying how to write it."""
    given = text.strip()
    shown = given.replace("Z", "+00:00").replace("z", "+00:00")
    if "T" not in shown.upper() and " " not in shown:
        raise HistoryTimeError(
            f"time {text!r} is a date, not a time: write e.g. {given[:10]}T00:00:00Z")
    try:
        at = _dt.datetime.fromisoformat(shown)
    except ValueError:
        hint = ""
        if re.search(r"\d \d\d:\d\d$", given):  # "...:21.715 00:00": a "+" read as a space
            hint = (": in a URL query a '+' arrives as a space, so write the offset as %2B00:00 "
                    "or use Z")
        raise HistoryTimeError(
            f"time {text!r} is not an ISO-8601 time such as 2026-03-01T12:00:00+00:00"
            f"{hint}") from None
    if at.tzinfo is None:
        raise HistoryTimeError(f"time {text!r} has no UTC offset: add +00:00 (or Z)")
    return at
