"""``AsyncCommandClient``: the command client for asyncio code.

>>> async with AsyncCommandClient(app, cfg) as client:                      # doctest: +SKIP
...     result = await client.send("acc-1", Deposit(10), expected_version=3, timeout=10)

It wraps a :class:`~cqrs.client.command_client.CommandClient` (one producer, one listener
thread): awaiting a result costs no thread while it is pending.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from cqrs.app import App
from cqrs.client.command_client import CommandClient, Outgoing
from cqrs.client.errors import CommandTimeoutError
from cqrs.client.replies import ResultFuture
from cqrs.config import CqrsConfig
from cqrs.results import CommandResult
from cqrs.topics import AppTopics

__all__ = ["AsyncCommandClient"]


class AsyncCommandClient:
    """``await send(...)`` returns the :class:`CommandResult`; ``send_many`` sends a batch and
    gathers the results. Build it inside or outside a running loop; close with ``aclose``."""

    def __init__(self, app: App, cfg: CqrsConfig | None = None, *,
                 topics: AppTopics | None = None, client: CommandClient | None = None) -> None:
        self.sync = client if client is not None else CommandClient(app, cfg, topics=topics)

    async def send(self, aggregate_id: str, command: object,
                   expected_version: int | None = None, command_id: str | None = None,
                   correlation_id: str | None = None, *,
                   timeout: float | None = None) -> CommandResult:
        """Send and await the result; :class:`CommandTimeoutError` after ``timeout`` s."""
        future = self.sync.send(aggregate_id, command, expected_version, command_id, correlation_id)
        return await self.wait(future, timeout)

    async def wait(self, future: ResultFuture, timeout: float | None = None) -> CommandResult:
        """Await a future from the sync client (e.g. one sent earlier without waiting)."""
        limit = self.sync.default_timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), limit)
        except TimeoutError:
            future.cancel()
            raise CommandTimeoutError(future.command_id, future.aggregate_id, limit) from None

    async def send_many(self, commands: Iterable[Outgoing], *,
                        timeout: float | None = None) -> list[CommandResult]:
        """Send ``commands`` in order and await every result (in the same order)."""
        futures = self.sync.send_many(commands)
        return list(await asyncio.gather(*(self.wait(f, timeout) for f in futures)))

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.sync.close)

    async def __aenter__(self) -> AsyncCommandClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
