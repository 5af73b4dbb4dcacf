"""The projections' part of the status board (``cqrs run app``, ``cqrs serve``, ``cqrs top``):
per projection, each live generation (the current one and one being rebuilt) with its
position per events-topic partition, its lag, and a rebuild's progress; and the records
waiting in the projections' dead-letter topic."""

from __future__ import annotations

from typing import Any

from cqrs.config import CqrsConfig
from projections.dlq import dead_letter_topic
from projections.model import projections_of
from projections.positions import topic_offsets
from projections.store import ProjectionStore, table_base

__all__ = ["ProjectionProbe", "generation_rows"]


def generation_rows(app: Any, store: ProjectionStore,
                    ends: dict[int, tuple[int, int]]) -> list[dict[str, Any]]:
    """``[{"name", "current", "building", "generations": [{"generation", "role",
    "positions", "lag", "total_lag", "progress"}]}]`` from the store and the events topic's
    ``{partition: (low, high)}``."""
    out = []
    for name in projections_of(app):
        base = table_base(app.name, name)
        gens = store.generations(base)
        rows = []
        for role, generation in (("current", gens.current), ("building", gens.building)):
            if generation is None:
                continue
            positions = store.positions(base, generation)
            at = {p: positions.get(p, low) for p, (low, _) in ends.items()}
            lag = {p: max(0, high - at[p]) for p, (_, high) in ends.items()}
            total = sum(high - low for low, high in ends.values())
            done = sum(at[p] - low for p, (low, _) in ends.items())
            rows.append({
                "generation": generation, "role": role,
                "positions": {str(p): o for p, o in sorted(at.items())},
                "lag": {str(p): n for p, n in sorted(lag.items())},
                "total_lag": sum(lag.values()),
                "progress": 1.0 if total == 0 else round(done / total, 4),
            })
        out.append({"name": name, "current": gens.current, "building": gens.building,
                    "generations": rows})
    return out


class ProjectionProbe:
    """A board probe: reads generations and positions from the read-model store."""

    def __init__(self, cfg: CqrsConfig, app: Any, board: Any, events_topic: str) -> None:
        self.cfg = cfg
        self.app = app
        self.board = board
        self.events_topic = events_topic
        self.dead_letters = dead_letter_topic(app.name, cfg.kafka.topic_prefix)
        self._store: ProjectionStore | None = None

    @classmethod
    def for_app(cls, cfg: CqrsConfig, app: Any, board: Any) -> ProjectionProbe:
        """The probe of an app's events topic (a ``cqrs.http.status.ProbeFactory``)."""
        from cqrs.topics import topics_for

        return cls(cfg, app, board, topics_for(app.name, cfg.kafka.topic_prefix).events)

    def __call__(self) -> None:
        from projections.stores import open_store

        if self._store is None:
            self._store = open_store(self.cfg)
        self.board.set_projections(
            generation_rows(self.app, self._store, topic_offsets(self.cfg, self.events_topic)))
        waiting = topic_offsets(self.cfg, self.dead_letters)  # empty until the topic exists
        self.board.set_dead_letters([{"topic": self.dead_letters, "stage": "projector",
                                      "waiting": sum(h - lo for lo, h in waiting.values())}])

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
