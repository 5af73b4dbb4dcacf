"""The status board: every figure of a running app in one thread-safe place, and its JSON.

Writers: the streaming-query listener (state, rates, batch durations and their phases, source
offsets), the queries' ``on_batch`` callbacks (the framework's own counters), the Kafka probe
(topic ends, lag, dead letters, result counts) and the projection probe (positions per
generation). Readers: ``/status.json``, ``/metrics`` (built from the same snapshot), the status
page and ``cqrs top``. Pure Python, no Spark or Kafka import: the unit tests drive it directly.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "BATCH_BUCKETS_S",
    "HISTORY_POINTS",
    "QueryFigures",
    "StatusBoard",
    "parse_offsets",
]

# upper bounds of the batch-duration histogram, seconds
BATCH_BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HISTORY_POINTS = 120  # chart points kept per query (one per progress event)


def parse_offsets(raw: Any, topic: str) -> dict[int, int]:
    """A source's offsets from a progress event: Spark's Kafka source writes
    ``{"topic": {"0": 12}}``, the processor's source ``{"0": 12, "tick": 7, "topic":
    "bank.commands"}``; anything else
    is empty."""
    import json

    if raw is None:
        return {}
    data = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(data, Mapping):
        return {}
    if topic in data and isinstance(data[topic], Mapping):
        data = data[topic]
    out: dict[int, int] = {}
    for p, o in data.items():
        if p in ("tick", "topic"):  # the processor's source: its tick and its topic's name
            continue
        try:
            out[int(p)] = int(o)
        except (TypeError, ValueError):
            return {}
    return out


@attrs.define
class QueryFigures:
    """One supervised query: who it is, its state, and what its progress events said."""

    name: str  # stable across restarts: "processor", "projector:balances"
    kind: str  # processor | projector
    input_topic: str
    # starting | active | restarting | refused (not restarted: see supervisor.refusal) | stopped
    state: str = "starting"
    # this run is past initialising its sources: it reported progress, or the supervisor saw
    # it waiting for data (an idle query, e.g. the retry job, reports no progress for hours)
    ready: bool = False
    query_name: str = ""
    query_id: str = ""
    run_id: str = ""
    generation: int | None = None
    restarts: int = 0
    last_error: str | None = None
    batches: int = 0
    input_rows: int = 0
    input_rate: float = 0.0
    processing_rate: float = 0.0
    last_batch_id: int | None = None
    last_progress_at: float | None = None
    duration_sum_s: float = 0.0
    duration_buckets: list[int] = attrs.field(factory=lambda: [0] * len(BATCH_BUCKETS_S))
    phases_ms: dict[str, float] = attrs.field(factory=dict)  # Spark's durationMs, last batch
    phase_totals_s: dict[str, float] = attrs.field(factory=dict)  # summed since start
    offsets: dict[int, int] = attrs.field(factory=dict)  # end offsets of the last batch
    # records of a batch as the query counts them, when Spark's rows are something else (the
    # processor's source yields one stats row per task): batch id -> records
    batch_rows: dict[int, int] = attrs.field(factory=dict)
    history: collections.deque[list[float]] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY_POINTS))


class StatusBoard:
    """The figures of one app's queries, counters and stores; :meth:`snapshot` is the JSON."""

    def __init__(self, app_name: str, *, source: str = "runner") -> None:
        self.app_name = app_name
        self.source = source
        self.started_at = time.time()
        self._lock = threading.Lock()
        self._queries: dict[str, QueryFigures] = {}
        self._by_id: dict[str, str] = {}  # Spark query id -> our name
        self._pending: dict[str, list[tuple[float, Any]]] = {}  # progress before binding
        self._counters: collections.Counter[str] = collections.Counter()
        self._projector_counters: dict[str, collections.Counter[str]] = {}
        self._ends: dict[str, dict[int, int]] = {}  # topic -> partition -> end offset
        self._dead_letters: dict[str, dict[str, Any]] = {}  # topic -> row
        self._projections: list[dict[str, Any]] = []
        self._memory: dict[str, int] = {}
        self._gauges: dict[str, float] = {}  # set_gauges: e.g. deadlines_waiting
        self._running_long: dict[str, Any] | None = None  # set_running_long
        self._ready_s: float | None = None  # every query ready (see QueryFigures.ready)
        self._active_s: float | None = None
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)

    # --- the supervisor -----------------------------------------------------------------

    def declare(self, name: str, kind: str, input_topic: str) -> None:
        """A query the runner keeps running (before it starts)."""
        with self._lock:
            self._queries.setdefault(name, QueryFigures(name, kind, input_topic))

    def bind(self, name: str, query_id: str, run_id: str, query_name: str,
             generation: int | None = None) -> None:
        """The query ``name`` now runs as Spark query ``query_id``."""
        with self._lock:
            q = self._queries[name]
            q.query_id, q.run_id, q.query_name, q.generation = query_id, run_id, query_name, generation
            q.state = "active"
            q.ready = False  # a new run initialises its sources again
            self._by_id[query_id] = name
            pending = self._pending.pop(query_id, [])
            if self._active_s is None and all(x.state == "active" for x in self._queries.values()):
                self._active_s = time.time() - self.started_at
        for at, progress in pending:
            self._apply_progress(name, progress, at)

    def mark_ready(self, name: str) -> None:
        """The query ``name`` is past initialising its sources (it reads or waits for data)."""
        with self._lock:
            self._queries[name].ready = True
            self._note_ready(time.time())

    def set_state(self, name: str, state: str, error: str | None = None) -> None:
        with self._lock:
            q = self._queries[name]
            q.state = state
            if state == "restarting":
                q.restarts += 1
            if error is not None:
                q.last_error = error
            self._events.append({"time": time.time(), "query": name, "state": state,
                                 "error": error})

    def log(self, message: str) -> None:
        with self._lock:
            self._events.append({"time": time.time(), "message": message})

    # --- the listener ---------------------------------------------------------------------

    def on_progress(self, query_id: str, progress: Mapping[str, Any]) -> None:
        """A ``StreamingQueryProgress`` as a dict: ``batchId``, ``numInputRows``,
        ``inputRowsPerSecond``, ``processedRowsPerSecond``, ``durationMs``, ``sources``
        (each with ``endOffset``)."""
        now = time.time()
        with self._lock:
            name = self._by_id.get(query_id)
            if name is None:
                self._pending.setdefault(query_id, []).append((now, progress))
                return
        self._apply_progress(name, progress, now)

    def _apply_progress(self, name: str, progress: Mapping[str, Any], at: float) -> None:
        with self._lock:
            q = self._queries[name]
            durations = {k: float(v) for k, v in (progress.get("durationMs") or {}).items()}
            total_s = durations.get("triggerExecution", 0.0) / 1000.0
            q.batches += 1
            q.ready = True
            q.last_batch_id = int(progress.get("batchId", -1))
            q.last_progress_at = at
            spark_rows = int(progress.get("numInputRows") or 0)
            rows = q.batch_rows.pop(q.last_batch_id, spark_rows)
            scale = rows / spark_rows if spark_rows else 0.0
            q.input_rows += rows
            q.input_rate = _number(progress.get("inputRowsPerSecond")) * scale
            q.processing_rate = _number(progress.get("processedRowsPerSecond")) * scale
            q.duration_sum_s += total_s
            for i, bound in enumerate(BATCH_BUCKETS_S):
                if total_s <= bound:
                    q.duration_buckets[i] += 1
            q.phases_ms = durations
            for k, v in durations.items():
                q.phase_totals_s[k] = q.phase_totals_s.get(k, 0.0) + v / 1000.0
            for source in progress.get("sources") or ():
                offsets = parse_offsets(source.get("endOffset"), q.input_topic)
                if offsets:
                    q.offsets = offsets
            q.history.append([round(at, 3), q.input_rate, q.processing_rate,
                              float(self._lag_of(q) or 0)])
            self._note_ready(at)

    def _note_ready(self, at: float) -> None:
        """Record when every query first was ready (the lock is held)."""
        if (self._ready_s is None and self._queries
                and all(x.ready and x.state == "active" for x in self._queries.values())):
            self._ready_s = at - self.started_at

    def _lag_of(self, q: QueryFigures) -> int | None:
        ends = self._ends.get(q.input_topic)
        if not ends or not q.offsets:
            return None
        return sum(max(0, end - q.offsets.get(p, 0)) for p, end in ends.items())

    # --- on_batch callbacks: the framework's own counters -------------------------------------

    def batch_rows(self, name: str, batch_id: int, rows: int) -> None:
        """The records batch ``batch_id`` of query ``name`` read, when Spark's row count is not
        that (its progress event, which follows, is scaled to it)."""
        with self._lock:
            q = self._queries[name]
            q.batch_rows[batch_id] = rows
            while len(q.batch_rows) > 100:
                q.batch_rows.pop(min(q.batch_rows))

    def count(self, **increments: float) -> None:
        """Add to the app's counters (``commands_in=5, dead_letters_written=1``)."""
        with self._lock:
            for k, v in increments.items():
                self._counters[k] += v  # type: ignore[assignment]

    def count_projector(self, projection: str, **increments: float) -> None:
        with self._lock:
            c = self._projector_counters.setdefault(projection, collections.Counter())
            for k, v in increments.items():
                c[k] += v  # type: ignore[assignment]

    # --- the probes -----------------------------------------------------------------------

    def set_ends(self, topic: str, ends: Mapping[int, int]) -> None:
        with self._lock:
            self._ends[topic] = dict(ends)

    def set_dead_letters(self, rows: list[dict[str, Any]]) -> None:
        """``[{"topic", "stage", "waiting"}]``; each probe reports its own topics."""
        with self._lock:
            for row in rows:
                self._dead_letters[row["topic"]] = dict(row)

    def set_projections(self, rows: list[dict[str, Any]]) -> None:
        with self._lock:
            self._projections = copy.deepcopy(rows)

    def set_gauges(self, **values: float | None) -> None:
        """Current values of the framework's gauges (``None``: unknown, left out)."""
        with self._lock:
            for k, v in values.items():
                if v is None:
                    self._gauges.pop(k, None)
                else:
                    self._gauges[k] = float(v)

    def set_running_long(self, lanes: int, longest: str, seconds: float) -> None:
        """The processor's aggregates set aside at the end of its last batch (see
        :mod:`cqrs.processor.lanes`) and the longest decision running among them."""
        with self._lock:
            self._running_long = ({"aggregates": lanes, "longest": longest or None,
                                   "seconds": round(seconds, 3) if longest else None}
                                  if lanes else None)

    def set_memory(self, rss: Mapping[str, int]) -> None:
        with self._lock:
            self._memory = dict(rss)

    # --- readers --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The status JSON (see docs/operations.md, "Status JSON")."""
        with self._lock:
            queries = []
            for q in self._queries.values():
                ends = self._ends.get(q.input_topic, {})
                lag = {str(p): max(0, end - q.offsets.get(p, 0)) for p, end in sorted(ends.items())
                       } if q.offsets else {}
                queries.append({
                    "name": q.name, "kind": q.kind, "query_name": q.query_name,
                    "id": q.query_id, "run_id": q.run_id, "state": q.state, "ready": q.ready,
                    "generation": q.generation, "input_topic": q.input_topic,
                    "restarts": q.restarts, "last_error": q.last_error,
                    "batches": q.batches, "last_batch_id": q.last_batch_id,
                    "last_progress_at": q.last_progress_at, "input_rows": q.input_rows,
                    "input_rate": q.input_rate, "processing_rate": q.processing_rate,
                    "batch_duration": {
                        "sum_s": q.duration_sum_s, "count": q.batches,
                        "buckets": [[b, n] for b, n in zip(BATCH_BUCKETS_S, q.duration_buckets)],
                    },
                    "phases_ms": dict(q.phases_ms), "phase_totals_s": dict(q.phase_totals_s),
                    "offsets": {str(p): o for p, o in sorted(q.offsets.items())},
                    "lag": lag, "total_lag": sum(lag.values()) if lag else None,
                    "history": [list(h) for h in q.history],
                })
            return {
                "app": self.app_name, "source": self.source, "time": time.time(),
                "started_at": self.started_at,
                "start": {"all_active_s": self._active_s, "all_ready_s": self._ready_s},
                "queries": queries,
                "counters": dict(self._counters),
                "gauges": dict(self._gauges),
                "running_long": self._running_long,
                "projector_counters": {k: dict(v) for k, v in self._projector_counters.items()},
                "topics": {t: {str(p): e for p, e in sorted(ends.items())}
                           for t, ends in sorted(self._ends.items())},
                "dead_letters": [dict(r) for _, r in sorted(self._dead_letters.items())],
                "projections": copy.deepcopy(self._projections),
                "memory": dict(self._memory),
                "events": list(self._events),
            }


def _number(value: Any) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return 0.0
    return f if f == f else 0.0  # NaN (no time elapsed) -> 0
