"""Record batches of the events topic -> the log table's columns, column at a time.

The log as a DataFrame (:mod:`cqrs.history.frames`) hands the executors Arrow batches of Kafka
records. Read record by record (:func:`cqrs.envelope.from_kafka`, a history row, a
:class:`~cqrs.history.rows.HistoryEvent`), a record cost ~13 us of Python, most of it the
envelope; here the envelope of the records the command processor writes (lean events: the
headers :func:`cqrs.envelope.event_to_kafka` writes, and nothing else) is read with Arrow
kernels, and only what cannot be (the payload's decoding, a derived event id) runs per record.

The rules are the record-by-record ones, not a second reading of them: a batch holding any
record that is not such an event (a ``cqrs.kind`` header, an integer header other than the
version, a time not written as the framework writes it, a repeated header, text that is not
UTF-8, a key that is empty or too long...) is read record by record instead
(:func:`cqrs.history.rows.row_from_record` and :func:`~cqrs.history.rows.decode_row`), and a
test compares the two on the same batches (tests/unit/test_log_table_unit.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from cqrs.domain.decision import event_id_for
from cqrs.envelope import (
    COMMAND_RECORD_PREFIX, CONTENT_TYPE, HEADER_PREFIX, MAX_AGGREGATE_ID_BYTES,
)

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["header_values", "lean_event_columns", "writer_columns"]

# the headers of a lean event (event_to_kafka), by the envelope field each holds
_TEXT_HEADERS: Final = ("message_type", "aggregate_type", "timestamp", "version", "message_id",
                        "command_id", "correlation_id", "causation_id")
_REQUIRED: Final = ("message_type", "aggregate_type", "timestamp", "version")
# present on no lean event: a batch with one of these is read record by record
_OTHER_HEADERS: Final = tuple(HEADER_PREFIX + n for n in ("kind", "expected_version",
                                                          "reply_partition"))
# the time exactly as the framework writes it (UTC, microseconds): Arrow and
# datetime.fromisoformat read other spellings differently, so those go record by record
_TIME: Final = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}\+00:00$"


def lean_event_columns(batch: pa.RecordBatch, *, derive_ids: bool = True
                       ) -> dict[str, Any] | None:
    """The envelope columns (as :meth:`~cqrs.history.columns.EventLayout.batch_of` takes them,
    but ``schema_type`` / ``schema_version``) and ``payload`` of a batch of Kafka records
    (:data:`~cqrs.history.frames.RECORD_COLUMNS`, each with a key and a version header) that are
    all lean events; ``None`` when one is not (read the batch record by record).
    ``derive_ids=False``: an event id the record does not carry is left null (for Spark to
    derive, see :func:`cqrs.history.columns.event_id_sql`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    key, value = batch.column("key"), batch.column("value")
    if key.null_count or value.null_count or batch.column("headers").null_count:
        return None
    sizes = pc.binary_length(key).to_numpy(zero_copy_only=False)
    if n and (sizes.min() == 0 or sizes.max() > MAX_AGGREGATE_ID_BYTES):
        return None
    prefix = pc.binary_slice(value, 0, len(COMMAND_RECORD_PREFIX))
    if pc.any(pc.equal(prefix, pa.scalar(COMMAND_RECORD_PREFIX, pa.binary()))).as_py():
        return None
    try:
        aggregate_id = key.cast(pa.string())  # checks UTF-8
    except pa.ArrowInvalid:
        return None
    headers = _headers(batch.column("headers"), n)
    if headers is None:
        return None
    text: dict[str, Any] = {}
    for name in _TEXT_HEADERS:
        column = headers.get(HEADER_PREFIX + name)
        if column is None:
            column = pa.nulls(n, pa.binary())
        try:
            text[name] = column.cast(pa.string())
        except pa.ArrowInvalid:
            return None
        if name in _REQUIRED and text[name].null_count:
            return None
    content = headers.get("content-type")
    if content is not None and content.null_count < n and not pc.all(pc.equal(
            content.drop_null(), pa.scalar(CONTENT_TYPE.encode(), pa.binary()))).as_py():
        return None
    if not pc.all(pc.match_substring_regex(text["timestamp"], _TIME)).as_py():
        return None
    try:
        version = text["version"].cast(pa.int64())
    except pa.ArrowInvalid:
        return None
    timestamp = text["timestamp"].cast(pa.timestamp("us", tz="UTC"))
    message_id = text["message_id"]
    if message_id.null_count and derive_ids:  # derived, as from_kafka derives it
        types, ids = text["aggregate_type"].to_pylist(), aggregate_id.to_pylist()
        given, versions = message_id.to_pylist(), version.to_pylist()
        message_id = pa.array([m if m is not None else event_id_for(t, a, v)
                               for m, t, a, v in zip(given, types, ids, versions, strict=True)],
                              pa.string())
    command_id = text["command_id"]
    recorded_us = batch.column("timestamp").cast(pa.int64())
    recorded = pc.multiply(pc.divide(recorded_us, 1000), 1000)  # Kafka's milliseconds
    return {
        "aggregate_type": text["aggregate_type"], "aggregate_id": aggregate_id,
        "version": version, "event_id": message_id, "message_type": text["message_type"],
        "timestamp": timestamp, "recorded_at": recorded.cast(pa.timestamp("us", tz="UTC")),
        "command_id": command_id,
        "correlation_id": pc.coalesce(text["correlation_id"], command_id),
        "causation_id": pc.coalesce(text["causation_id"], command_id),
        "partition": batch.column("partition"), "offset": batch.column("offset"),
        "payload": value,
    }


def _headers(column: pa.ListArray, n: int) -> dict[str, pa.Array] | None:
    """One binary array per header name of the records (null where a record lacks it); None
    when a record repeats a header or has one no lean event has."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
    flat = pc.list_flatten(column)
    names, values = flat.field("key"), flat.field("value")
    found: dict[str, pa.Array] = {}
    for name in pc.unique(names).to_pylist():
        if name in _OTHER_HEADERS:
            return None
        where = pc.equal(names, name).to_numpy(zero_copy_only=False)
        owners = parents[where]  # ascending: a record's headers are together
        if len(owners) > 1 and (owners[1:] == owners[:-1]).any():
            return None  # a repeated header: record by record (which one counts is its rule)
        index = np.full(n, -1, dtype=np.int64)
        index[owners] = np.arange(len(owners))
        taken = pa.array(index, mask=index < 0)
        found[name] = pc.take(values.filter(pa.array(where)), taken)
    return found


def header_values(column: pa.ListArray, name: str) -> pa.Array:
    """The value of header ``name`` of each record of a ``headers`` column (binary; the first
    when a record repeats it, as :func:`cqrs.processor.job.header_expr` reads it; null when a
    record has none), with Arrow kernels."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(column)
    flat = pc.list_flatten(column)
    where = pc.equal(flat.field("key"), name)
    owners = pc.list_parent_indices(column).filter(where).to_numpy(zero_copy_only=False)
    if not len(owners):
        return pa.nulls(n, pa.binary())
    first = np.ones(len(owners), dtype=bool)
    first[1:] = owners[1:] != owners[:-1]
    index = np.full(n, -1, dtype=np.int64)
    index[owners[first]] = np.nonzero(first)[0]
    return pc.take(flat.field("value").filter(where), pa.array(index, mask=index < 0))


def writer_columns(payloads: list[bytes], writer_of: Callable[[bytes], tuple[str, int]]
                   ) -> tuple[list[str | None], list[int | None]]:
    """``schema_type`` and ``schema_version`` of each payload, as
    :func:`~cqrs.history.rows.decode_row` gives them, asked once per writer schema (the
    payload's header: magic and fingerprint)."""
    from cqrs.codec.single_object import HEADER_SIZE

    seen: dict[bytes, tuple[str | None, int | None]] = {}
    types: list[str | None] = []
    versions: list[int | None] = []
    for p in payloads:
        head = p[:HEADER_SIZE]
        w = seen.get(head)
        if w is None:
            try:
                w = seen[head] = writer_of(p)
            except Exception:  # noqa: BLE001 - as decode_row: the envelope still reads
                w = seen[head] = (None, None)
        types.append(w[0])
        versions.append(w[1])
    return types, versions
