"""The supervisor of ``cqrs run app`` on real Spark queries of one session: a query whose batch
fails is restarted alone after its back-off (the other keeps its run), a generation switch
restarts a query on the new generation, and the listener feeds the board."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cqrs.ops.board import StatusBoard
from cqrs.ops.listener import attach_listener
from cqrs.ops.supervisor import QuerySpec, Supervisor


def _rate_query(spark: Any, folder: Path, name: str,
                on_batch: Callable[[int], None]) -> Callable[[int | None], Any]:
    def start(generation: int | None) -> Any:
        def batch(_: Any, batch_id: int) -> None:
            on_batch(batch_id)

        suffix = f"-g{generation}" if generation is not None else ""
        return (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
                .writeStream.foreachBatch(batch)
                .option("checkpointLocation", str(folder / f"{name}{suffix}"))
                .queryName(f"{name}{suffix}").trigger(processingTime="1 second").start())
    return start


def _wait(what: str, check: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def test_a_failing_query_restarts_alone_and_generations_switch(spark: Any, tmp_path: Path,
                                                               unique_name: str) -> None:
    board = StatusBoard("supervised")
    listener = attach_listener(spark, board)
    failures_left = [1]

    def fail_once(batch_id: int) -> None:
        if batch_id >= 2 and failures_left[0] > 0:
            failures_left[0] -= 1
            raise RuntimeError("planned failure of the test")

    generation = [1]
    specs = [
        QuerySpec("failing", "processor", "rate",
                  _rate_query(spark, tmp_path, f"{unique_name}-failing", fail_once)),
        QuerySpec("steady", "projector", "rate",
                  _rate_query(spark, tmp_path, f"{unique_name}-steady", lambda _: None),
                  generation=lambda: generation[0]),
    ]
    said: list[str] = []
    supervisor = Supervisor(board, specs, backoff_s=1.0, report=said.append, poll_s=0.5)
    stop = threading.Event()
    runner = threading.Thread(target=supervisor.run, args=(stop,), daemon=True)
    runner.start()

    def queries() -> dict[str, Any]:
        return {q["name"]: q for q in board.snapshot()["queries"]}

    try:
        _wait("both running", lambda: all(q["state"] == "active" for q in queries().values()))
        steady_run = queries()["steady"]["run_id"]
        _wait("the failing one restarted",
              lambda: queries()["failing"]["restarts"] == 1 and queries()["failing"]["state"] == "active")
        failing = queries()["failing"]
        assert "planned failure of the test" in (failing["last_error"] or "")
        _wait("the restarted one runs batches again",
              lambda: (queries()["failing"]["last_batch_id"] or 0) >= 3)
        steady = queries()["steady"]
        assert (steady["restarts"], steady["run_id"], steady["state"]) == (0, steady_run, "active")
        assert any("failing: " in m and "restart 1 in 1 s" in m for m in said), said

        generation[0] = 2  # a rebuild made generation 2 current
        _wait("the steady one on generation 2", lambda: queries()["steady"]["generation"] == 2)
        assert queries()["steady"]["query_name"].endswith("-g2")
        assert queries()["steady"]["restarts"] == 0  # a switch is not a failure
        assert any("generation 2 is current now" in m for m in said), said
        _wait("progress from generation 2",
              lambda: queries()["steady"]["batches"] > steady["batches"])
    finally:
        stop.set()
        runner.join(timeout=60)
        spark.streams.removeListener(listener)
    assert not runner.is_alive()
    assert {q["state"] for q in queries().values()} == {"stopped"}
    assert not [q for q in spark.streams.active if q.name and q.name.startswith(unique_name)]


def test_an_idle_query_counts_as_ready_without_a_batch(spark: Any, tmp_path: Path,
                                                      unique_name: str) -> None:
    """Like the retry job with no dead letter: a query that never gets data runs no batch and
    Spark posts no progress event for its idle triggers, yet the app is ready once it waits."""
    board = StatusBoard("supervised")
    listener = attach_listener(spark, board)
    empty = tmp_path / "no-files-ever"
    empty.mkdir()

    def idle_query(generation: int | None) -> Any:
        return (spark.readStream.format("text").load(str(empty))
                .writeStream.foreachBatch(lambda _df, _id: None)
                .option("checkpointLocation", str(tmp_path / f"{unique_name}-idle"))
                .queryName(f"{unique_name}-idle").trigger(processingTime="1 second").start())

    specs = [QuerySpec("busy", "processor", "rate",
                       _rate_query(spark, tmp_path, f"{unique_name}-busy", lambda _: None)),
             QuerySpec("idle", "retrier", "retries", idle_query)]
    supervisor = Supervisor(board, specs, backoff_s=1.0, report=lambda _: None, poll_s=0.5)
    stop = threading.Event()
    runner = threading.Thread(target=supervisor.run, args=(stop,), daemon=True)
    runner.start()
    try:
        _wait("every query ready", lambda: board.snapshot()["start"]["all_ready_s"] is not None)
        s = board.snapshot()
        idle = {q["name"]: q for q in s["queries"]}["idle"]
        assert (idle["state"], idle["ready"], idle["batches"]) == ("active", True, 0)
        assert s["start"]["all_ready_s"] >= s["start"]["all_active_s"]
    finally:
        stop.set()
        runner.join(timeout=60)
        spark.streams.removeListener(listener)
    assert not runner.is_alive()
