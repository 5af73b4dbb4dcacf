"""The retry job: dead letters of transient failures delivered again after a backoff, letters
out of attempts parked, every letter's history kept for operators (``cqrs dlq``).

- :mod:`cqrs.retrier.plan`: the pure decisions (due times, the re-delivered record, filters);
- :mod:`cqrs.retrier.store`: the Cassandra tables;
- :mod:`cqrs.retrier.service`: ingest and delivery, driver side;
- :mod:`cqrs.retrier.job`: the Spark query and the timer (``cqrs run retrier``);
- :mod:`cqrs.retrier.operators`: list, show, retry, park, purge (CLI and HTTP).
"""

from __future__ import annotations

__all__: list[str] = []
