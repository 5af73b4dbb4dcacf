"""``cqrs sql APP QUERY``: Spark SQL over the event log, and ``cqrs archive APP PATH``: the log
to Parquet (see docs/history.md)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from cqrs.config import CqrsConfig

__all__ = ["arrow_rows", "register", "rows_json", "rows_table"]


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    sql = commands.add_parser(
        "sql", help="Spark SQL over the event log: a view per event type and one of every "
        "event's envelope",
        description="Runs a Spark SQL query (local Spark, configured by [spark]) over temporary "
        "views of the app's event log, read from its events topic (or an archive, --source): "
        "`events`, every event's envelope (aggregate_type, aggregate_id, version, event_type, "
        "event_id, timestamp, recorded_at, command_id, correlation_id, causation_id, "
        "schema_type, schema_version, partition, offset), and one view per event type named by "
        "the last part of its type name (`Deposited` for example.bank.Deposited; the whole name "
        "with '_' for '.' when two types share it), with the envelope and the event's fields "
        "as columns, in today's shape. Prints a table, or JSON.")
    sql.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    sql.add_argument("query", help="the SQL, e.g. \"SELECT event_type, count(*) FROM events "
                     "GROUP BY event_type\"")
    sql.add_argument("--source", metavar="PATH", default=None,
                     help="read an archive (`cqrs archive`) instead of the events topic")
    _time_range(sql)
    sql.add_argument("--max-rows", type=int, default=1000,
                     help="rows to print at most (default 1000; a note says when there are more)")
    sql.add_argument("--json", action="store_true",
                     help="a JSON array of rows (objects by column name) instead of a table")
    sql.set_defaults(run=_run_sql)

    archive = commands.add_parser(
        "archive", help="write the event log to Parquet, partitioned by event type and day",
        description="Reads the app's events topic once (one row per aggregate and version), "
        "decodes every event into today's shape and writes PATH/event_type=<type>/day=<date>/"
        "*.parquet: plain columns (the envelope, `payload`, the event's bytes as written, and "
        "the event's fields) that Spark, pandas or DuckDB read without this framework, and "
        "PATH/_cqrs_archive.json (what was archived, and the schemas `cqrs sql --source` and "
        "log_table(source=PATH) decode the payloads with). PATH is a folder on any file system "
        "Spark writes (hdfs://, s3a://...).")
    archive.add_argument("app", help="the App, as module:attribute")
    archive.add_argument("path", help="the archive's folder (new, or an archive with --overwrite)")
    archive.add_argument("--event-type", dest="event_types", action="append", default=None,
                         metavar="TYPE",
                         help="archive only this event type (repeatable; default: every type)")
    _time_range(archive)
    archive.add_argument("--overwrite", action="store_true",
                         help="replace the archive at PATH (never a folder that is not one)")
    archive.set_defaults(run=_run_archive)


def _time_range(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", default=None, metavar="TIME",
                        help="only events Kafka recorded at or after TIME (ISO-8601 with a UTC "
                        "offset, e.g. 2026-03-01T00:00:00Z)")
    parser.add_argument("--until", default=None, metavar="TIME",
                        help="only events recorded before TIME")


def _times(args: argparse.Namespace) -> tuple[Any, Any]:
    from cqrs.history.forms import parse_time

    return (None if args.since is None else parse_time(args.since),
            None if args.until is None else parse_time(args.until))


def arrow_rows(table: Any) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The column names and rows of an Arrow table (a query's result through ``toArrow``: times
    keep their UTC offset), each value plain Python (a struct a dict, a map a dict, an array a
    list); columns of the same name (a join's) stay apart."""
    columns = [table.column(i) for i in range(table.num_columns)]
    values = [[_plain(v, c.type) for v in c.to_pylist()] for c in columns]
    return list(table.column_names), list(zip(*values, strict=True))


def _plain(value: Any, kind: Any) -> Any:
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_map(kind):
        return {k: _plain(v, kind.item_type) for k, v in value}
    if pa.types.is_struct(kind):
        return {f.name: _plain(value[f.name], f.type) for f in kind}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return [_plain(v, kind.value_type) for v in value]
    return value


def rows_json(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """Rows as a JSON array of objects by column name (times in ISO-8601, bytes in base64)."""
    from cqrs.client.json_commands import to_jsonable

    return json.dumps([to_jsonable(dict(zip(columns, r, strict=True))) for r in rows], indent=2)


def rows_table(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    """Rows as a text table (structs, arrays and maps as JSON; numbers to the right)."""
    from cqrs.cli.tables import render_table
    from cqrs.client.json_commands import to_jsonable

    def cell(value: Any) -> Any:
        if isinstance(value, (dict, list)):
            return json.dumps(to_jsonable(value), sort_keys=True)
        if isinstance(value, (int, float, str)) or value is None:
            return value
        return to_jsonable(value)

    numeric = {c for r in rows for c, v in zip(columns, r, strict=True)
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return render_table(columns, [[cell(v) for v in r] for r in rows], max_width=60,
                        right=numeric)


def _run_sql(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.history import LogTableError, log_views
    from cqrs.loading import load_app
    from cqrs.spark_session import spark_session

    if args.max_rows < 1:
        raise LogTableError(f"--max-rows {args.max_rows}: print at least one row")
    app = load_app(args.app)
    since, until = _times(args)
    spark = spark_session(cfg, f"cqrs-sql-{app.name}")
    # a query Spark refuses is said once, below, not also logged as a JSON record with its trace
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    views = log_views(spark, args.app, since=since, until=until, source=args.source, cfg=cfg)
    try:
        columns, rows = arrow_rows(spark.sql(args.query).limit(args.max_rows + 1).toArrow())
    except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException / ParseException
        if type(exc).__module__.startswith("pyspark"):
            raise LogTableError(
                f"Spark could not run the query: {str(exc).strip().splitlines()[0]}; the views "
                f"of app {app.name!r} are {sorted(views)}") from None
        raise
    more = len(rows) > args.max_rows
    rows = rows[:args.max_rows]
    print(rows_json(columns, rows) if args.json else rows_table(columns, rows))
    if more:
        print(f"... more rows than --max-rows {args.max_rows}: add a LIMIT, or raise --max-rows",
              file=sys.stderr)
    return 0


def _run_archive(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.cli.run_cmd import say
    from cqrs.history import write_archive
    from cqrs.loading import load_app
    from cqrs.spark_session import spark_session

    app = load_app(args.app)
    since, until = _times(args)
    spark = spark_session(cfg, f"cqrs-archive-{app.name}")
    report = write_archive(spark, args.app, args.path, event_types=args.event_types,
                           since=since, until=until, overwrite=args.overwrite, cfg=cfg,
                           progress=say)
    for name, count in report.event_types.items():
        print(f"{count:>12,}  {name}")
    return 0
