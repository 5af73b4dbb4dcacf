"""The small HTTP server of ``cqrs run app`` (standard library only): ``/metrics`` (Prometheus
text), ``/status.json`` (the status JSON both are made from) and ``/`` (the status page)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from cqrs.ops.metrics import metrics_text

__all__ = ["METRICS_CONTENT_TYPE", "StatusServer", "status_page"]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def status_page() -> bytes:
    """The status page: one static HTML file with its script inline (no build, no CDN)."""
    return resources.files("cqrs.ops").joinpath("status_page.html").read_bytes()


class StatusServer:
    """Serves a snapshot function on ``host:port`` in a daemon thread (port 0: any free one)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]], host: str, port: int) -> None:
        self.snapshot = snapshot

        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, METRICS_CONTENT_TYPE, metrics_text(outer.snapshot))
                elif path == "/status.json":
                    self._send(200, "application/json",
                               json.dumps(outer.snapshot()).encode())
                elif path == "/":
                    self._send(200, "text/html; charset=utf-8", status_page())
                else:
                    self._send(404, "text/plain", b"not found: try /, /status.json or /metrics\n")

            def _send(self, code: int, kind: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # scrapes every few seconds would flood the runner's output

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="cqrs-status-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
