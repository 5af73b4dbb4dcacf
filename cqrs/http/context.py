"""What every route of the HTTP service shares: the app, its configuration, a command client,
a state reader and the recently sent commands (so a result can be fetched after the send)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from cqrs.app import App
from cqrs.client.command_client import CommandClient
from cqrs.client.query import StateReader
from cqrs.client.replies import ResultFuture
from cqrs.config import CqrsConfig

__all__ = ["HttpContext", "RecentCommands", "RouteFactory"]

RouteFactory = Callable[["HttpContext"], Any]
"""``routes(ctx) -> fastapi.APIRouter``: how a module adds routes (``cqrs serve --routes``)."""


class RecentCommands:
    """The futures of the last ``capacity`` commands sent through the service, by command id;
    the oldest are cancelled (forgotten by the client) when the map is full."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._futures: collections.OrderedDict[str, ResultFuture] = collections.OrderedDict()
        self._lock = threading.Lock()

    def add(self, future: ResultFuture) -> None:
        with self._lock:
            self._futures[future.command_id] = future
            self._futures.move_to_end(future.command_id)
            while len(self._futures) > self.capacity:
                _, old = self._futures.popitem(last=False)
                old.cancel()

    def get(self, command_id: str) -> ResultFuture | None:
        with self._lock:
            return self._futures.get(command_id)


class HttpContext:
    """Built once per server. The command client and the state reader start on first use, so
    bad requests are answered without touching Kafka or Spark."""

    def __init__(self, app: App, cfg: CqrsConfig, *,
                 client: CommandClient | None = None, states: StateReader | None = None,
                 recent_capacity: int = 10_000) -> None:
        self.app = app
        self.cfg = cfg
        self.recent = RecentCommands(recent_capacity)
        # what forgetting a data subject rewrites besides deleting the key (the read models'
        # step, set by `cqrs serve`, which sees the projections package)
        self.forget_steps: list[Any] = []
        self._client = client
        self._states = states
        self._deadlines: Any = None
        self._history: Any = None
        self._lock = threading.Lock()

    def has_client(self) -> bool:
        return self._client is not None

    @property
    def client(self) -> CommandClient:
        with self._lock:
            if self._client is None:
                self._client = CommandClient(self.app, self.cfg)
            return self._client

    @property
    def states(self) -> StateReader:
        with self._lock:
            if self._states is None:
                self._states = StateReader(self.app, self.cfg)
            return self._states

    @property
    def history(self) -> Any:
        """The app's :class:`~cqrs.history.HistoryReader`, opened on first use."""
        with self._lock:
            if self._history is None:
                from cqrs.history import HistoryReader

                self._history = HistoryReader(self.app, self.cfg)
            return self._history

    @property
    def deadlines(self) -> Any:
        """The app's deadline store (:mod:`cqrs.scheduler.store`), opened on first use."""
        with self._lock:
            if self._deadlines is None:
                from cqrs.scheduler.store import open_deadline_store
                from cqrs.topics import topics_for

                self._deadlines = open_deadline_store(
                    self.cfg, topics_for(self.app.name, self.cfg.kafka.topic_prefix).base)
            return self._deadlines

    def close(self) -> None:
        with self._lock:
            deadlines, self._deadlines = self._deadlines, None
            history, self._history = self._history, None
            client, states, self._client, self._states = self._client, self._states, None, None
        if deadlines is not None:
            deadlines.close()
        if history is not None:
            history.close()
        if client is not None:
            client.close()
        if states is not None:
            states.close()
