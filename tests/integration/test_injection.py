"""Values are bound, never written into CQL: text built to break out of a CQL string, as an
aggregate id and as a read-model value, is stored and read back as it is, on the real
Cassandra, and the keyspace is still there afterwards."""

from __future__ import annotations

from cqrs.config import CqrsConfig
from domain_examples.bank import AccountOpened, MoneyDeposited, app
from projections import LocalProjector, ProjectionReader, records_for
from projections.stores import open_store

HOSTILE = ["acc'; DROP KEYSPACE cqrs; --", 'acc"); DROP TABLE x; --', "acc' OR '1'='1",
           "acc\\'; --", "acc-ü-\u2028"]


def _keyspaces(cfg: CqrsConfig) -> set[str]:
    from cqrs.cassandra_io import cql_cluster

    cluster = cql_cluster(cfg.cassandra.contact_points(), cfg.cassandra.port)
    try:
        return {r.keyspace_name for r in cluster.connect().execute(
            "SELECT keyspace_name FROM system_schema.keyspaces")}
    finally:
        cluster.shutdown()


def test_hostile_text_is_stored_and_read_as_it_is(cqrs_config: CqrsConfig, unique_keyspace: str) -> None:
    cfg = cqrs_config.with_overrides(cassandra={"keyspace": unique_keyspace})
    before = _keyspaces(cfg)
    store = open_store(cfg)
    LocalProjector(app, store).apply(records_for(app, [
        *((acc, AccountOpened(owner=acc[::-1])) for acc in HOSTILE),
        *((acc, MoneyDeposited(7)) for acc in HOSTILE),
    ]))
    reader = ProjectionReader(app, store)
    for acc in HOSTILE:
        row = reader.get("balances", acc)
        assert row is not None and row["owner"] == acc[::-1] and row["balance_cents"] == 7, acc
    assert reader.get("balances", "acc") is None  # nothing matched more than its own key

    assert _keyspaces(cfg) >= before  # nothing dropped
