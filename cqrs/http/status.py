"""The status routes of ``cqrs serve``: ``/`` (the status page), ``/status.json`` and
``/metrics`` (Prometheus text, made from the same JSON).

The service runs no query itself. It reads what Kafka and the stores say on its own (topic
ends, dead letters waiting, results by status, projection positions per generation) and, when
``[metrics]`` names the app runner (``cqrs run app``, by default on ``http://host:port`` of that
section), takes the queries, their rates, lag and batch figures, the runner's memory and its
counters from the runner's ``/status.json``. When the runner does not answer, the page says so
and the counters are the service's own, counted from the results topic since it started.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from cqrs.app import App
from cqrs.config import CqrsConfig
from cqrs.ops.board import StatusBoard

__all__ = ["ProbeFactory", "ServeStatus", "status_router"]

ProbeFactory = Callable[[CqrsConfig, App, StatusBoard], Callable[[], None]]
"""``factory(cfg, app, board) -> probe``: adds figures to the service's board (projections)."""

RUNNER_TIMEOUT_S = 2.0
# what the runner knows better than the service: it runs the queries and counts their batches
FROM_RUNNER = ("queries", "start", "memory", "counters", "projector_counters", "events")


class ServeStatus:
    """The service's board, its probes (started on first use) and the runner's status."""

    def __init__(self, app: App, cfg: CqrsConfig, probes: Sequence[ProbeFactory] = ()) -> None:
        self.app = app
        self.cfg = cfg
        self.board = StatusBoard(app.name, source="serve")
        self._probe_factories = list(probes)
        self._poller: Any = None
        self._lock = threading.Lock()

    def _ensure_polling(self) -> None:
        with self._lock:
            if self._poller is not None:
                return
            from cqrs.ops.kafka_probe import KafkaProbe, Poller
            from cqrs.topics import topics_for

            topics = topics_for(self.app.name, self.cfg.kafka.topic_prefix)
            probes = [KafkaProbe(self.cfg, topics, self.board),
                      *(f(self.cfg, self.app, self.board) for f in self._probe_factories)]
            self._poller = Poller(self.board, probes, self.cfg.metrics.refresh_s)
            self._poller.run_once()  # the first page already has figures
            self._poller.start()

    def runner_status(self) -> tuple[dict[str, Any] | None, str | None]:
        """The runner's status JSON, or why there is none."""
        url = self.cfg.metrics.status_url()
        if url is None:
            return None, "no runner configured ([metrics] runner_url = 'none')"
        try:
            with urllib.request.urlopen(f"{url}/status.json", timeout=RUNNER_TIMEOUT_S) as r:
                found = json.loads(r.read())
        except (OSError, ValueError) as exc:
            return None, f"runner at {url} not reachable: {exc}"
        if found.get("app") != self.app.name:
            return None, f"runner at {url} runs app {found.get('app')!r}, not {self.app.name!r}"
        return found, None

    def snapshot(self) -> dict[str, Any]:
        self._ensure_polling()
        own = self.board.snapshot()
        runner, error = self.runner_status()
        if runner is not None:
            for key in FROM_RUNNER:
                own[key] = runner.get(key, own.get(key))
        own["runner"] = {"url": self.cfg.metrics.status_url(), "reachable": runner is not None,
                         "error": error, "checked_at": time.time()}
        return own

    def close(self) -> None:
        with self._lock:
            if self._poller is not None:
                self._poller.stop()
                self._poller = None


def status_router(status: ServeStatus) -> Any:
    """``/``, ``/status.json`` and ``/metrics`` over ``status``."""
    from fastapi import APIRouter
    from fastapi.responses import HTMLResponse, Response

    from cqrs.ops.metrics import metrics_text
    from cqrs.ops.server import METRICS_CONTENT_TYPE, status_page

    router = APIRouter(tags=["status"])

    # return types are Any: FastAPI resolves annotations, and these classes are imported here
    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> Any:
        return HTMLResponse(status_page())

    @router.get("/status.json")
    def status_json() -> dict[str, Any]:
        """Queries, counters, topic ends, dead letters, projections (docs/operations.md)."""
        return status.snapshot()

    @router.get("/metrics", response_class=Response)
    def metrics() -> Any:
        """The same figures in the Prometheus text format."""
        return Response(metrics_text(status.snapshot), media_type=METRICS_CONTENT_TYPE)

    return router
