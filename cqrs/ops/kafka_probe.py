"""Figures read from Kafka for the status board: topic ends (for lag), events appended, dead
letters waiting, and command results by status (read from the start of each result record's
value, see :func:`cqrs.results.result_head`, so nothing else is decoded). Plus
:class:`Poller`, the thread that runs every probe of a board periodically.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.kafka_io import OffsetReader, make_consumer, take
from cqrs.ops.board import StatusBoard
from cqrs.results import result_head
from cqrs.topics import AppTopics

__all__ = ["KafkaProbe", "Poller", "Probe"]

Probe = Callable[[], None]


class KafkaProbe:
    """Reads the app's topics' ends and tails its results topic, feeding ``board``.

    Counting starts where the topics end when the probe first sees them (a topic created
    later is counted from its beginning), so the counters cover what happened while the probe
    ran, like any process-local Prometheus counter.
    """

    def __init__(self, cfg: CqrsConfig, topics: AppTopics, board: StatusBoard) -> None:
        self.cfg = cfg
        self.topics = topics
        self.board = board
        self.dead_letter_topics = [(topics.dead_letters, "processor")]
        self._readers: dict[str, OffsetReader] = {}
        self._missing_at_start: set[str] = set()
        self._seen: set[str] = set()
        self._events_base: int | None = None
        self._tail: Any = None

    def _ends(self, topic: str) -> dict[int, int] | None:
        reader = self._readers.get(topic)
        if reader is None:
            reader = self._readers[topic] = OffsetReader(self.cfg, topic)
        try:
            marks = reader.watermarks()
        except CqrsError:  # not created yet
            reader.close()
            del self._readers[topic]
            if topic not in self._seen:
                self._missing_at_start.add(topic)
            return None
        self._seen.add(topic)
        return {p: high for p, (_, high) in marks.items()}

    def __call__(self) -> None:
        """One round: ends and dead letters, then whatever results arrived."""
        for topic in (self.topics.commands, self.topics.events, self.topics.results):
            ends = self._ends(topic)
            if ends is not None:
                self.board.set_ends(topic, ends)
                if topic == self.topics.events:
                    self._count_events(sum(ends.values()), topic)
        rows = []
        for topic, stage in self.dead_letter_topics:
            reader = self._readers.get(topic) or OffsetReader(self.cfg, topic)
            self._readers[topic] = reader
            try:
                marks = reader.watermarks()
            except CqrsError:
                reader.close()
                del self._readers[topic]
                continue
            rows.append({"topic": topic, "stage": stage,
                         "waiting": sum(high - low for low, high in marks.values())})
        self.board.set_dead_letters(rows)
        self._read_results()

    def _count_events(self, total: int, topic: str) -> None:
        if self._events_base is None:
            self._events_base = 0 if topic in self._missing_at_start else total
        if total > self._events_base:
            self.board.count(events_out=total - self._events_base)
            self._events_base = total

    def _read_results(self) -> None:
        from confluent_kafka import TopicPartition

        topic = self.topics.results
        if self._tail is None:
            reader = self._readers.get(topic)
            if reader is None or topic not in self._seen:
                return
            marks = reader.watermarks()
            start_low = topic in self._missing_at_start
            self._tail = make_consumer(self.cfg, **{"enable.partition.eof": False})
            self._tail.assign([TopicPartition(topic, p, low if start_low else high)
                               for p, (low, high) in marks.items()])
        counts: dict[str, int] = {}
        while True:
            messages = take(self._tail, 5000, 0.2)
            for m in messages:
                if m.error():
                    continue
                head = result_head(m.value())
                if head is not None:
                    # a command answered again (its first result once more) is not a new result
                    status = "duplicates" if m.headers() else head.status
                    counts[status] = counts.get(status, 0) + 1
            if len(messages) < 5000:
                break
        if counts:
            self.board.count(**counts)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._tail is not None:
            self._tail.close()
            self._tail = None


class Poller:
    """Runs the probes every ``interval_s`` seconds in a daemon thread; a probe that raises is
    logged on the board and tried again next round."""

    def __init__(self, board: StatusBoard, probes: Sequence[Probe], interval_s: float) -> None:
        self.board = board
        self.probes = list(probes)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cqrs-status-poller", daemon=True)
        self._errors: dict[int, str] = {}

    def start(self) -> Poller:
        self._thread.start()
        return self

    def run_once(self) -> None:
        for i, probe in enumerate(self.probes):
            try:
                probe()
                self._errors.pop(i, None)
            except Exception as exc:  # noqa: BLE001 - a status page must survive a flaky probe
                text = f"{type(exc).__name__}: {exc}"
                if self._errors.get(i) != text:  # log each new error once
                    self._errors[i] = text
                    self.board.log(f"probe {getattr(probe, '__name__', type(probe).__name__)} "
                                   f"failed: {text}")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        for probe in self.probes:
            close = getattr(probe, "close", None)
            if close is not None:
                close()
