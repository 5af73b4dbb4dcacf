"""One local cluster for every module here: started before the first of them (unless it is
running already), stopped after the last (unless it was running before). Each module works
under its own topic prefix, keyspace and checkpoints on it (``cluster_harness.fresh_names``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster_harness import cluster_up
from cqrs.config import CqrsConfig


@pytest.fixture(scope="package")
def local_cluster() -> Iterator[CqrsConfig]:
    """The running cluster: the configuration its processes were started with."""
    with cluster_up() as base:
        yield base
