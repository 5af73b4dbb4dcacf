"""The status board, its Prometheus metrics, the status page file and ``cqrs top``'s screen:
pure code, driven with progress events shaped like Spark's."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cqrs.cli.top_cmd import render_top, sparkline
from cqrs.ops.board import StatusBoard, parse_offsets
from cqrs.ops.metrics import metrics_text
from cqrs.ops.server import status_page


def _progress(batch: int, rows: int, ends: Any, millis: int = 1200) -> dict[str, Any]:
    return {"batchId": batch, "numInputRows": rows, "inputRowsPerSecond": 10.0,
            "processedRowsPerSecond": float("nan") if batch == 0 else 20.0,
            "durationMs": {"triggerExecution": millis, "addBatch": millis - 200, "walCommit": 50},
            "sources": [{"endOffset": ends}]}


def _board() -> StatusBoard:
    board = StatusBoard("bank")
    board.declare("processor", "processor", "bank.commands")
    board.declare("projector:balances", "projector", "bank.events")
    board.set_ends("bank.commands", {0: 10, 1: 7})
    board.set_ends("bank.events", {0: 4, 1: 4})
    board.on_progress("q-1", _progress(0, 5, '{"0": 5, "1": 7}'))  # before bind: kept
    board.batch_rows("processor", 1, 40)  # Spark's 2 rows were 40 commands
    board.on_progress("q-1", _progress(1, 2, '{"0": 5, "1": 7}'))
    board.bind("processor", "q-1", "r-1", "cqrs-processor-bank")
    board.bind("projector:balances", "q-2", "r-2", "cqrs-projector-bank-balances-g1", 1)
    board.on_progress("q-2", _progress(0, 8, '{"bank.events": {"0": 4, "1": 3}}', 300))
    board.count(commands_in=12, accepted=9, rejected=2, failed=1, events_out=9, read_s=0.5)
    board.count(commands_in=3, accepted=3)
    board.count_projector("balances", events=8, applied=7, dead_letters=1)
    board.set_dead_letters([{"topic": "bank.dead-letters", "stage": "processor", "waiting": 1}])
    board.set_projections([{"name": "balances", "current": 1, "building": 2, "generations": [
        {"generation": 1, "role": "current", "positions": {"0": 4, "1": 3}, "lag": {"0": 0, "1": 1},
         "total_lag": 1, "progress": 0.875},
        {"generation": 2, "role": "building", "positions": {"0": 2, "1": 0}, "lag": {"0": 2, "1": 4},
         "total_lag": 6, "progress": 0.25}]}])
    return board


def test_offsets_of_both_sources() -> None:
    assert parse_offsets('{"0": 5, "1": 7}', "bank.commands") == {0: 5, 1: 7}
    assert parse_offsets('{"bank.events": {"0": 4}}', "bank.events") == {0: 4}
    # the processor's source: its tick and its topic are not partitions
    assert parse_offsets('{"0": 5, "tick": 9, "topic": "bank.commands"}', "bank.commands") == {0: 5}
    assert parse_offsets(None, "t") == {} and parse_offsets('"x"', "t") == {}


def test_snapshot_has_lag_rates_and_start() -> None:
    s = _board().snapshot()
    proc, proj = s["queries"]
    assert proc["state"] == "active" and proc["batches"] == 2 and proc["input_rows"] == 45
    assert proc["lag"] == {"0": 5, "1": 0} and proc["total_lag"] == 5
    assert (proc["input_rate"], proc["processing_rate"]) == (200.0, 400.0)  # scaled by 20
    assert proc["history"][0][2] == 0.0  # NaN from Spark (no time elapsed) is 0
    assert proj["generation"] == 1 and proj["total_lag"] == 1
    assert proj["batch_duration"]["buckets"][:3] == [[0.1, 0], [0.25, 0], [0.5, 1]]
    assert s["counters"]["commands_in"] == 15 and s["counters"]["accepted"] == 12
    assert s["start"]["all_active_s"] is not None and s["start"]["all_ready_s"] is not None
    assert proc["ready"] and proj["ready"]  # both reported progress


def test_ready_means_every_query_past_initialising_not_a_batch_from_each() -> None:
    board = StatusBoard("bank")
    board.declare("processor", "processor", "bank.commands")
    board.declare("retrier", "retrier", "bank.retries")
    board.bind("processor", "q-1", "r-1", "cqrs-processor-bank")
    board.mark_ready("retrier")  # not started yet: a stale word does not make the app ready
    assert board.snapshot()["start"]["all_ready_s"] is None
    board.bind("retrier", "q-3", "r-3", "cqrs-retrier-bank")
    s = board.snapshot()
    assert s["start"]["all_active_s"] is not None and s["start"]["all_ready_s"] is None
    assert [q["ready"] for q in s["queries"]] == [False, False]  # both still initialising
    board.on_progress("q-1", _progress(0, 5, '{"0": 5}'))  # the processor ran a batch
    assert board.snapshot()["start"]["all_ready_s"] is None  # the retry job still initialises
    # the supervisor saw the retry job waiting for data: no dead letter came, so it runs no batch
    board.mark_ready("retrier")
    s = board.snapshot()
    ready_s = s["start"]["all_ready_s"]
    assert ready_s is not None and 0 <= ready_s < 60
    retrier = s["queries"][1]
    assert (retrier["ready"], retrier["batches"], retrier["last_progress_at"]) == (True, 0, None)
    # a restart initialises its sources again; the start figure is the first time, and stays
    board.set_state("retrier", "restarting", "boom")
    board.bind("retrier", "q-4", "r-4", "cqrs-retrier-bank")
    s = board.snapshot()
    assert s["queries"][1]["ready"] is False and s["start"]["all_ready_s"] == ready_s


def test_restart_is_counted_and_logged() -> None:
    board = _board()
    board.set_state("processor", "restarting", "boom\nstack")
    s = board.snapshot()
    assert s["queries"][0]["restarts"] == 1 and s["queries"][0]["last_error"] == "boom\nstack"
    assert s["events"][-1]["query"] == "processor"


def test_metrics_parse_and_match_the_snapshot() -> None:
    board = _board()
    families = {f.name: f for f in text_string_to_metric_families(
        metrics_text(board.snapshot).decode())}

    def value(family: str, sample: str, **labels: str) -> float:
        found = [s.value for s in families[family].samples
                 if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
        assert len(found) == 1, (family, sample, labels, families[family].samples)
        return found[0]

    assert value("cqrs_commands_in", "cqrs_commands_in_total") == 15
    assert value("cqrs_command_results", "cqrs_command_results_total", status="accepted") == 12
    assert value("cqrs_command_results", "cqrs_command_results_total", status="rejected") == 2
    assert value("cqrs_command_results", "cqrs_command_results_total", status="failed") == 1
    assert value("cqrs_events_out", "cqrs_events_out_total") == 9
    assert value("cqrs_dead_letters_written", "cqrs_dead_letters_written_total",
                 stage="projector:balances") == 1
    assert value("cqrs_query_up", "cqrs_query_up", query="processor") == 1
    assert value("cqrs_query_lag_records", "cqrs_query_lag_records", query="processor",
                 partition="0") == 5
    assert value("cqrs_batch_duration_seconds", "cqrs_batch_duration_seconds_count",
                 query="projector:balances") == 1
    assert value("cqrs_batch_duration_seconds", "cqrs_batch_duration_seconds_bucket",
                 query="processor", le="1.0") == 0
    assert value("cqrs_batch_duration_seconds", "cqrs_batch_duration_seconds_count",
                 query="processor") == 2
    assert value("cqrs_batch_phase_seconds", "cqrs_batch_phase_seconds_total",
                 query="processor", phase="addBatch") == pytest.approx(2.0)
    assert value("cqrs_processor_phase_seconds", "cqrs_processor_phase_seconds_total",
                 phase="read") == 0.5
    assert value("cqrs_dead_letters_waiting", "cqrs_dead_letters_waiting", stage="processor") == 1
    assert value("cqrs_projection_lag_records", "cqrs_projection_lag_records", generation="2",
                 role="building") == 6
    assert value("cqrs_projection_rebuild_progress_ratio",
                 "cqrs_projection_rebuild_progress_ratio", generation="2") == 0.25
    assert value("cqrs_projection_position", "cqrs_projection_position", generation="1",
                 partition="1") == 3
    ready_s = board.snapshot()["start"]["all_ready_s"]
    assert value("cqrs_start_seconds", "cqrs_start_seconds", until="all_ready_s") == ready_s


def test_deadline_figures_are_counters_and_a_gauge() -> None:
    board = _board()
    board.count(deadlines_scheduled=7, deadlines_cancelled=1, deadlines_fired=5,
                deadlines_dropped=1, deadline_lateness_s=1.5)
    board.set_gauges(deadlines_waiting=3)
    text = metrics_text(board.snapshot).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert (samples["cqrs_deadlines_scheduled_total"], samples["cqrs_deadlines_cancelled_total"],
            samples["cqrs_deadlines_fired_total"], samples["cqrs_deadlines_dropped_total"],
            samples["cqrs_deadline_lateness_seconds_total"], samples["cqrs_deadlines_waiting"]) == (
        7, 1, 5, 1, 1.5, 3)
    board.set_gauges(deadlines_waiting=None)  # unknown: left out
    assert "cqrs_deadlines_waiting{" not in metrics_text(board.snapshot).decode()


def test_a_decision_running_long_shows_in_status_metrics_and_top() -> None:
    board = _board()
    assert board.snapshot()["running_long"] is None
    assert "running long" not in render_top(board.snapshot(), colour=False)
    board.count(decisions_set_aside=2, decisions_timed_out=1)
    board.set_running_long(1, "slow.Job 'hung', command 'h1'", 12.34)
    snap = board.snapshot()
    assert snap["running_long"] == {"aggregates": 1, "longest": "slow.Job 'hung', command 'h1'",
                                    "seconds": 12.34}
    text = metrics_text(board.snapshot).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert (samples["cqrs_decisions_set_aside_total"], samples["cqrs_decisions_timed_out_total"],
            samples["cqrs_decisions_running_long"], samples["cqrs_longest_decision_seconds"]) == (
        2, 1, 1, 12.34)
    screen = render_top(snap, colour=False)
    assert ("running long: 1 aggregate(s) set aside; longest slow.Job 'hung', command 'h1' for "
            "12.3 s") in screen, screen
    board.set_running_long(0, "", 0.0)  # the lanes emptied
    assert board.snapshot()["running_long"] is None


def test_status_page_is_offline_html_over_status_json() -> None:
    page = status_page().decode()
    assert page.startswith("<!doctype html>") and 'fetch("status.json"' in page
    # no CDN: nothing loaded from elsewhere (the SVG namespace is a name, not a download)
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert page.replace("http://www.w3.org/2000/svg", "").count("http") == 0


def test_top_screen() -> None:
    screen = render_top(_board().snapshot(), colour=False)
    assert "processor" in screen and "projector:balances" in screen
    assert "commands in: 15" in screen and "accepted: 12" in screen
    assert "every query was ready" in screen
    assert "\x1b[" not in screen
    assert "[#####               ] 25%" in screen  # the rebuild's progress
    assert sparkline([0, 1, 2, 4]) == "▁▃▅█" and sparkline([0, 0]) == "▁▁"
    assert "deadlines:" not in screen  # an app that never scheduled one
    board = _board()
    board.count(deadlines_scheduled=4, deadlines_fired=2, deadline_lateness_s=0.5)
    board.set_gauges(deadlines_waiting=2)
    screen = render_top(board.snapshot(), colour=False)
    assert ("deadlines: waiting 2.0  scheduled 4  cancelled 0  fired 2  mean lateness 0.25 s"
            in screen), screen


def test_runner_server_serves_page_json_and_metrics() -> None:
    import json
    import urllib.request

    from cqrs.ops.server import StatusServer

    board = _board()
    server = StatusServer(board.snapshot, "127.0.0.1", 0).start()
    try:
        def get(path: str) -> tuple[str, bytes]:
            with urllib.request.urlopen(server.url + path, timeout=10) as r:
                return r.headers["Content-Type"], r.read()

        kind, body = get("/status.json")
        assert kind == "application/json" and json.loads(body)["counters"]["commands_in"] == 15
        kind, body = get("/metrics")
        assert kind.startswith("text/plain; version=0.0.4")
        names = {f.name for f in text_string_to_metric_families(body.decode())}
        assert {"cqrs_commands_in", "cqrs_query_up", "cqrs_batch_duration_seconds"} <= names
        assert get("/")[1] == status_page()
        with pytest.raises(urllib.error.HTTPError) as missing:
            get("/nothing")
        assert missing.value.code == 404
    finally:
        server.close()


def test_memory_of_this_process_and_its_children() -> None:
    import os
    import subprocess
    import sys

    from cqrs.ops.memory import children, rss_bytes, tree_rss_bytes

    assert rss_bytes(os.getpid()) > 1 << 20  # a Python process holds more than 1 MiB
    assert rss_bytes(2**22 + 7) == 0  # no such process
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while child.pid not in children(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in children(os.getpid())
        # the child is still starting, so its figure moves between reads: compare with slack
        assert rss_bytes(child.pid) > 0
        assert tree_rss_bytes() > rss_bytes(os.getpid()) + (1 << 20)
    finally:
        child.kill()
        child.wait()
