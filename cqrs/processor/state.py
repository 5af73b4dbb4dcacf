"""Reading the command processor's aggregate state (interactive queries on the checkpoint).

The processor keeps one :class:`~cqrs.results.AggregateRecord` per (aggregate type, aggregate id)
in Spark's keyed state (value state ``"aggregate"`` of the transformWithState operator). Spark's
state data source (``spark.read.format("statestore")``) reads it straight from the checkpoint: the
last committed micro-batch by default, so it works while the processor is running and after it
stopped. The bytes are decoded with the app's codec bound to the Kafka schema store.

>>> state = read_state(spark, cfg, app, checkpoint, "acc-1")      # doctest: +SKIP
>>> state.version, state.state.balance                            # doctest: +SKIP

Each read scans the whole state of the checkpoint (every state partition): fine for operations
and tests, not a serving path for high request rates (that is what projections are for).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from cqrs.config import CqrsConfig
from cqrs.errors import CqrsError
from cqrs.processor.job import STATE_NAME
from cqrs.results import AggregateRecord
from cqrs.topics import AppTopics, topics_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from cqrs.app import App
    from cqrs.codec.registry import Codec

__all__ = [
    "AggregateState",
    "AmbiguousAggregateError",
    "CheckpointNotFoundError",
    "StateReadError",
    "checkpoint_has_commits",
    "decode_state",
    "load_states",
    "path_exists",
    "read_all_states",
    "read_state",
    "state_codec",
]


class CheckpointNotFoundError(CqrsError, FileNotFoundError):
    """The processor checkpoint does not exist or holds no committed micro-batch yet."""


class AmbiguousAggregateError(CqrsError, LookupError):
    """An aggregate id exists under several aggregate types and no type was given."""


class StateReadError(CqrsError, RuntimeError):
    """Spark's state data source cannot read the checkpoint (e.g. not a processor checkpoint)."""


@attrs.frozen
class AggregateState:
    """One aggregate as the processor holds it.

    ``state`` is the decoded aggregate object (``None`` before the first event and after a
    terminal event, then ``deleted`` is true); ``seen_command_ids`` are the command ids the
    processor remembers for de-duplication, oldest first.
    """

    aggregate_type: str
    aggregate_id: str
    version: int
    deleted: bool
    state: Any
    seen_command_ids: tuple[str, ...] = ()


# ---- file system helpers (any Hadoop file system: local, HDFS, S3...) ------------------------


def _fs_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark._jvm  # noqa: SLF001 - the Hadoop FileSystem API is only reachable this way
    assert jvm is not None, "a classic (non Spark Connect) session is needed"
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark._jsc.hadoopConfiguration()), hpath  # noqa: SLF001


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether ``path`` exists (any file system Spark can reach)."""
    fs, hpath = _fs_path(spark, path)
    return bool(fs.exists(hpath))


def checkpoint_has_commits(spark: SparkSession, checkpoint: str) -> bool:
    """Whether the checkpoint holds at least one committed micro-batch."""
    fs, hpath = _fs_path(spark, checkpoint.rstrip("/") + "/commits")
    if not fs.exists(hpath):
        return False
    return any(not st.getPath().getName().startswith(".") for st in fs.listStatus(hpath))


def _require_checkpoint(spark: SparkSession, checkpoint: str) -> None:
    if not path_exists(spark, checkpoint):
        raise CheckpointNotFoundError(
            f"processor checkpoint {checkpoint!r} does not exist: run the processor first "
            "(`cqrs run processor <module:app>`), or pass the checkpoint it uses (--checkpoint)"
        )
    if not checkpoint_has_commits(spark, checkpoint):
        raise CheckpointNotFoundError(
            f"processor checkpoint {checkpoint!r} has no committed micro-batch yet: wait for the "
            "processor's first batch, or check that --checkpoint names the processor's checkpoint"
        )


# ---- reading ---------------------------------------------------------------------------------


def read_all_states(spark: SparkSession, checkpoint: str, *, batch_id: int | None = None) -> DataFrame:
    """Every aggregate record in the checkpoint: ``aggregate_type, aggregate_id, record`` (bytes).

    ``batch_id`` reads the state as of that committed micro-batch (default: the last one).
    """
    _require_checkpoint(spark, checkpoint)
    # RocksDB state loads call the StateStoreCoordinator, which a session creates with its
    # StreamingQueryManager: a fresh session that never ran a query cannot read without this
    spark.streams  # noqa: B018
    reader = (spark.read.format("statestore").option("path", checkpoint)
              .option("stateVarName", STATE_NAME))
    if batch_id is not None:
        if batch_id < 0:
            raise StateReadError(f"batch_id {batch_id} is negative: give a committed batch id")
        reader = reader.option("batchId", str(batch_id))
    try:
        df = reader.load()
        return df.select(
            df["key.aggregate_type"].alias("aggregate_type"),
            df["key.aggregate_id"].alias("aggregate_id"),
            df["value.record"].alias("record"),
        )
    except Exception as exc:  # AnalysisException & co: not a processor checkpoint, bad batch
        raise StateReadError(
            f"cannot read the aggregate state of checkpoint {checkpoint!r}: {exc}; check that it "
            "is a command processor checkpoint (not a projector's) and that the batch exists"
        ) from exc


def state_codec(cfg: CqrsConfig, app: App, topics: AppTopics | None = None) -> tuple[Codec, Any]:
    """The app's codec bound to the Kafka schema store, and the store (close it when done)."""
    from cqrs.codec.kafka_schema_store import KafkaSchemaStore

    t = topics or topics_for(app.name, cfg.kafka.topic_prefix)
    store = KafkaSchemaStore(cfg.kafka.bootstrap_servers, t.schemas, cfg.kafka.client_options())
    return app.codec_for(store), store


def decode_state(codec: Codec, aggregate_type: str, aggregate_id: str, blob: bytes) -> AggregateState:
    """An :class:`AggregateState` from the stored record bytes."""
    record = codec.decode(bytes(blob))
    if not isinstance(record, AggregateRecord):
        raise StateReadError(
            f"state of {aggregate_type} {aggregate_id!r} holds a {type(record).__name__}, not an "
            "AggregateRecord: the checkpoint was not written by the cqrs command processor"
        )
    state = None if record.snapshot is None else codec.decode(record.snapshot)
    return AggregateState(aggregate_type, aggregate_id, record.version, record.deleted, state,
                          tuple(s.command_id for s in record.seen))


def read_state(
    spark: SparkSession,
    cfg: CqrsConfig,
    app: App,
    checkpoint: str,
    aggregate_id: str,
    aggregate_type: str | None = None,
    *,
    topics: AppTopics | None = None,
    batch_id: int | None = None,
) -> AggregateState | None:
    """The state of one aggregate, or ``None`` if the processor holds none for it.

    ``aggregate_type`` (stable type name, e.g. ``example.bank.Account``) is needed only when the
    same id exists under several aggregate types.
    """
    if aggregate_type is not None and aggregate_type not in app.model.aggregates:
        raise StateReadError(
            f"aggregate type {aggregate_type!r} is not in app {app.name!r} (types: "
            f"{sorted(app.model.aggregates)}): pass one of these to --type"
        )
    from pyspark.sql import functions as F

    df = read_all_states(spark, checkpoint, batch_id=batch_id)
    df = df.where(F.col("aggregate_id") == aggregate_id)
    if aggregate_type is not None:
        df = df.where(F.col("aggregate_type") == aggregate_type)
    rows = df.collect()
    if not rows:
        return None
    if len(rows) > 1:
        types = sorted(r["aggregate_type"] for r in rows)
        raise AmbiguousAggregateError(
            f"aggregate id {aggregate_id!r} exists under several types {types}: pass the type "
            "(aggregate_type=... / --type)"
        )
    codec, store = state_codec(cfg, app, topics)
    try:
        row = rows[0]
        return decode_state(codec, row["aggregate_type"], row["aggregate_id"], row["record"])
    finally:
        store.close()


def load_states(
    spark: SparkSession,
    cfg: CqrsConfig,
    app: App,
    checkpoint: str,
    *,
    topics: AppTopics | None = None,
    batch_id: int | None = None,
) -> dict[tuple[str, str], AggregateState]:
    """Every aggregate of the checkpoint decoded on the driver, by (type, id): for comparisons
    and small states (use :func:`read_all_states` to stay in Spark)."""
    rows = read_all_states(spark, checkpoint, batch_id=batch_id).collect()
    codec, store = state_codec(cfg, app, topics)
    try:
        return {
            (r["aggregate_type"], r["aggregate_id"]):
                decode_state(codec, r["aggregate_type"], r["aggregate_id"], r["record"])
            for r in rows
        }
    finally:
        store.close()
