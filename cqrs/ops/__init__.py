"""Operating an app: one Spark driver for all its queries, their status as JSON, Prometheus
metrics made from that JSON, and the status page and ``cqrs top`` over it.

- :mod:`cqrs.ops.board`: :class:`StatusBoard`, the one thread-safe place the figures gather in,
  and its JSON (:meth:`StatusBoard.snapshot`);
- :mod:`cqrs.ops.listener`: a Spark ``StreamingQueryListener`` feeding the board;
- :mod:`cqrs.ops.kafka_probe`: offsets, lag, dead letters and result counts read from Kafka;
- :mod:`cqrs.ops.supervisor`: keeps an app's queries running, restarting one that fails;
- :mod:`cqrs.ops.metrics`: the status JSON as Prometheus metric families;
- :mod:`cqrs.ops.server`: the small HTTP server of ``cqrs run app``;
- :mod:`cqrs.ops.memory`: resident memory of a process tree from ``/proc``.
"""

from cqrs.ops.board import StatusBoard
from cqrs.ops.metrics import StatusCollector, metrics_text

__all__ = ["StatusBoard", "StatusCollector", "metrics_text"]
