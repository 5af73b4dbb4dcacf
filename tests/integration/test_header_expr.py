"""``header_expr``: the Spark SQL that reads one Kafka header, checked on Spark itself."""

from __future__ import annotations

from typing import Any

from cqrs.processor.job import HEADER_POSITIONS, header_expr

SCHEMA = "id int, headers array<struct<key: string, value: binary>>"


def test_reads_the_first_matching_header_wherever_it_is(spark: Any) -> None:
    from pyspark.sql import functions as F

    far = [(f"x-{i}", b"pad") for i in range(HEADER_POSITIONS + 3)]
    rows = [
        (1, [("a", b"1"), ("wanted", b"first"), ("wanted", b"second")]),
        (2, [("a", b"1")]),  # missing
        (3, []),
        (4, None),
        (5, [*far, ("wanted", b"far back")]),  # beyond the positional CASE: the fallback
        (6, [("wanted", None)]),
    ]
    frame = spark.createDataFrame(rows, SCHEMA)
    got = {r.id: r.v for r in frame.select(
        "id", F.expr(header_expr("wanted")).cast("string").alias("v")).collect()}
    assert got == {1: "first", 2: None, 3: None, 4: None, 5: "far back", 6: None}
