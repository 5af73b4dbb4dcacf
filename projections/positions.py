"""Where each projection is in the event log, and how far behind: ``cqrs projections status``."""

from __future__ import annotations

from typing import Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import TopicNotFoundError
from cqrs.kafka_io import watermarks
from projections.model import projections_of
from projections.store import ProjectionStore, table_base

__all__ = ["PartitionStatus", "ProjectionStatus", "projection_status", "topic_offsets"]


def topic_offsets(cfg: CqrsConfig, topic: str) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` watermarks of a topic (empty if it does not exist yet)."""
    try:
        return watermarks(cfg, topic)
    except TopicNotFoundError:
        return {}


@attrs.frozen
class PartitionStatus:
    partition: int
    position: int  # next offset the projection will read
    end: int  # end of the log now
    lag: int


@attrs.frozen
class ProjectionStatus:
    name: str
    current: int | None
    building: int | None
    partitions: list[PartitionStatus]

    @property
    def lag(self) -> int:
        return sum(p.lag for p in self.partitions)


def projection_status(cfg: CqrsConfig, app: Any, store: ProjectionStore,
                      events_topic: str) -> list[ProjectionStatus]:
    ends = topic_offsets(cfg, events_topic)
    out = []
    for name in projections_of(app):
        base = table_base(app.name, name)
        gens = store.generations(base)
        positions = store.positions(base, gens.current) if gens.current is not None else {}
        parts = []
        for p, (low, high) in ends.items():
            pos = positions.get(p, low)
            parts.append(PartitionStatus(p, pos, high, max(0, high - pos)))
        out.append(ProjectionStatus(name, gens.current, gens.building, parts))
    return out
