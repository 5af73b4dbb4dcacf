"""Jobs that are a Python thread rather than a Spark query (process managers, the deadline
scheduler), shaped as a streaming query so the runners treat them alike: ``cqrs run app``'s
supervisor restarts one that failed, ``serve_query`` runs one alone, the status board shows its
progress reports."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["LoopQuery"]


class LoopQuery:
    """A job's thread with the face of a ``StreamingQuery``: ``id``, ``runId``, ``name``,
    ``isActive``, ``exception()``, ``status``, ``lastProgress``, ``recentProgress``, ``stop()``
    and ``awaitTermination()``. Subclasses implement :meth:`_serve`, which runs until
    :attr:`_stop` is set (or its work is done) and calls :meth:`_ready` once it serves."""

    def __init__(self, name: str,
                 on_progress: Callable[[str, Mapping[str, Any]], None] | None = None) -> None:
        self.id = str(uuid.uuid4())
        self.runId = str(uuid.uuid4())  # noqa: N815 - StreamingQuery's name
        self.name = name
        self.lastProgress: dict[str, Any] | None = None  # noqa: N815
        self._on_progress = on_progress
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._message = "Initializing sources"
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    # ---- the query's face -----------------------------------------------------------------------

    @property
    def isActive(self) -> bool:  # noqa: N802
        return self._thread.is_alive()

    def exception(self) -> BaseException | None:
        return self._error

    @property
    def status(self) -> dict[str, Any]:
        return {"message": self._message, "isDataAvailable": False, "isTriggerActive": False}

    @property
    def recentProgress(self) -> list[dict[str, Any]]:  # noqa: N802
        return [] if self.lastProgress is None else [self.lastProgress]

    def stop(self) -> None:
        """Stop after the work in hand (written and recorded)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return None if timeout is None else not self._thread.is_alive()

    def start(self) -> LoopQuery:
        self._thread.start()
        return self

    # ---- for subclasses -------------------------------------------------------------------------

    def _serve(self) -> None:
        raise NotImplementedError

    def _ready(self) -> None:
        self._message = "Waiting for data to arrive"
        self._started.set()

    def _report(self, progress: dict[str, Any]) -> None:
        progress = {"id": self.id, "runId": self.runId, "name": self.name, **progress}
        self.lastProgress = progress
        if self._on_progress is not None:
            self._on_progress(self.id, progress)

    def _main(self) -> None:
        try:
            self._serve()
        except BaseException as exc:  # noqa: BLE001 - the runner sees it through exception()
            self._error = exc
        finally:
            self._message = "Stopped"
            self._started.set()
