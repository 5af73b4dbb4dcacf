"""The benchmark programs run, at a tiny size, so that one cannot rot unseen between the
quiet-machine runs that take their figures (bench/projector.py once crashed after its first
part for a whole round). Their figures are not looked at here: CI must not depend on the speed
of a shared machine.

Every script under bench/ runs (the library modules, harness.py, report.py, procmem.py and
floor.py, through the scripts that use them). To fit CI's time, the scripts run in two lanes at
once, each a ``bench_driver.py`` process running its scripts one after the other: the scripts
that drive Spark in their own process share that process's JVM; beside them, the scripts that
start a ``cqrs run ...`` app of their own (whose Spark starts in that app) mostly wait for it.
This file took ~44 s when it ran three of the scripts; with all of them, ~125 s (the two lanes
one after the other took ~175 s).
bench/kstreams.py runs the Kafka Streams peer, a Maven build and a Kafka of its own for minutes:
what it reads from the peer's output is checked on a sample instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import attrs
import pytest

from cqrs.config import CqrsConfig
from ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("bench_driver.py")
LANES_TIMEOUT_S = 540.0  # both lanes, within pytest's timeout (600 s) for the whole test


def _bench(args: list[str], env: dict[str, str], timeout: float) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_runner_bench_runs(tmp_path: Path) -> None:
    out = _bench(["bench/runner.py", "--aggregates", "50", "--commands", "2000", "--no-peer",
                  "--results", str(tmp_path)], dict(os.environ), 120)
    assert "LocalRunner batch" in out and "LocalRunner one by one" in out
    assert list(tmp_path.glob("runner-*.json"))


@attrs.frozen
class Smoke:
    """One script's tiny run: its arguments and what its output must show."""

    script: str
    args: tuple[str, ...]
    shows: tuple[str, ...]  # each must appear in what the script printed
    writes: tuple[str, ...] = ()  # glob patterns of files it must leave in the results folder


def _in_process_lane(results: Path) -> list[Smoke]:
    """Scripts that run Spark in their own process: one after the other, on the lane's JVM."""
    out = str(results)
    return [
        # our throughput run is the --personal one's below (the same function, another app):
        # none here (--aggregates with no count); the memory plot it would feed is drawn by
        # bench/report.py in test_the_report_redraws_a_results_file
        Smoke("bench/processor.py",
              ("--aggregates", "--commands", "200", "--rate", "20", "--seconds", "1",
               "--latency-aggregates", "10", "--no-warm-up", "--no-settle", "--peer-aggregates", "5",
               "--results-dir", out, "--img-dir", out),
              ("RESULT latency rate=20/s",
               "RESULT spark floor latency", "RESULT spark floor throughput",
               "RESULT spark floor + mapInArrow latency", "RESULT spark floor + mapInArrow throughput",
               "RESULT eventsourcing sqlite aggregates=5", "RESULT eventsourcing popo aggregates=5",
               "## Summary"),
              ("2*.json", "processor-throughput.png", "processor-latency.png")),
        Smoke("bench/processor.py",
              ("--personal", "--aggregates", "20", "--commands", "500", "--rounds", "1",
               "--no-warm-up", "--no-settle", "--results-dir", out),
              ("RESULT personal round 1, 20 aggregates: plain", "RESULT personal / plain:")),
        Smoke("bench/projector.py",
              ("--stream-events", "1000", "--rebuild-events", "1000", "--accounts", "50",
               "--no-warm-up", "--no-settle"),
              ("RESULT steady stream", "RESULT rebuild of 1,000 events")),
        Smoke("bench/history.py",
              ("--events", "40", "--aggregates", "10", "--hot", "10", "--reads", "2", "--no-settle",
               "--results-dir", out),
              ("RESULT HistoryReader.events(limit=10)", "RESULT HistoryReader.state_at",
               "RESULT GET /aggregates/{id}/events", "RESULT log_table count per type (again)",
               "RESULT states_as_of: 10 aggregates", "0 aggregates differ"),
              ("history-*.json",)),
        Smoke("bench/state_read.py", ("--aggregates", "5", "--reads", "5"),
              ("RESULT state_reader reads=5", "RESULT http reads=5")),
        Smoke("bench/state_store.py", ("--rows", "200", "--rounds", "1", "--no-settle"),
              ("RESULT cassandra rows round=1", "RESULT kafka changelog round=1")),
    ]


def _app_lane(results: Path) -> list[Smoke]:
    """Scripts that start a ``cqrs run ...`` subprocess and drive it, then those that need no
    Spark at all (they would make the other lane the longer one)."""
    out = str(results)
    return [
        Smoke("bench/client.py", ("--clients", "1", "--round-trips", "2", "--modes", "routed"),
              ("RESULT clients=1 mode=routed round_trips=2",)),
        Smoke("bench/app_latency.py",
              ("--rate", "4", "--seconds", "1", "--aggregates", "2", "--port", str(free_port()),
               "--results-dir", out),
              ("round trips: p50",), ("app-latency-*.json",)),
        Smoke("bench/conversations.py",
              ("--rates", "0", "--count", "2", "--singles", "2", "--warm-up", "0",
               "--port", str(free_port()), "--img", str(results / "conversations.png"),
               "--results-dir", out),
              ("'label': 'one command'", "'label': 'conversation, one at a time', 'rate': 0.0",
               "'n': 2"),
              ("conversations-*.json", "conversations.png")),
        Smoke("bench/deadlines.py",
              ("--count", "20", "--rate", "20", "--lead", "3", "--watch-after", "1", "--idle", "10",
               "--idle-seconds", "1", "--idle-start", "1", "--results-dir", out),
              ('"fired": 18', '"expected": 18', '"cancelled_fired": 0', '"unexpected": 0',
               '"pending": 10', "scheduler_cpu_fraction_of_a_core"),
              ("deadlines-*.json",)),
        Smoke("bench/slice_profile.py",
              ("--aggregates", "10", "--commands", "100", "--slice", "50", "--top", "5"),
              ("100 commands over 10 aggregates", "CPU per command", "times under cProfile")),
        Smoke("bench/step_parts.py", ("--aggregates", "50", "--repeat", "1"),
              ("50 aggregates, one deposit each", "AggregateStep.apply", "glue (apply minus",
               "encode the state record")),
        Smoke("bench/retrier.py", ("--sizes", "5", "--rounds", "2", "--due", "2"),
              ("5 waiting", "round delivering 2")),
        Smoke("bench/peers.py",
              ("--persistence", "sqlite", "popo", "--aggregates", "5", "--commands", "20"),
              ("RESULT eventsourcing sqlite aggregates=5", "RESULT eventsourcing popo aggregates=5")),
    ]


def _driver_argv(smokes: Sequence[Smoke]) -> list[str]:
    argv = [sys.executable, str(DRIVER)]
    for n, smoke in enumerate(smokes):
        argv += (["--"] if n else []) + [smoke.script, *smoke.args]
    return argv


def _sections(output: str, smokes: Sequence[Smoke]) -> list[tuple[str, str]]:
    """What each script of a lane printed, and how it ended (``ok``, ``failed`` or ``did not
    end``), in the lane's order."""
    parts = output.split("SMOKE ")[1:]  # "<script> starts: ...", then "<script> ok 12.3" ...
    found = []
    for smoke in smokes:
        text, status = "", "did not start"
        if parts and parts[0].startswith(f"{smoke.script} starts"):
            text = parts.pop(0)
            status = "did not end"
            if parts and parts[0].startswith(smoke.script + " "):
                status = parts.pop(0).split()[1]
        found.append((text, status))
    return found


def _problems(lane: str, smokes: Sequence[Smoke], output: str, results: Path) -> list[str]:
    problems = []
    for smoke, (text, status) in zip(smokes, _sections(output, smokes), strict=True):
        label = f"{lane}: {smoke.script} {' '.join(smoke.args[:2])}"
        if status != "ok":
            problems.append(f"{label}: {status}")
            continue
        problems += [f"{label}: printed no {want!r}" for want in smoke.shows if want not in text]
        # bench/processor.py notes a failed measurement as a row and goes on: not here
        problems += [f"{label}: {line}" for line in text.splitlines() if line.startswith("FAILED ")]
        problems += [f"{label}: wrote no {pattern}" for pattern in smoke.writes
                     if not list(results.glob(pattern))]
    return problems


def _interrupt(proc: subprocess.Popen[str]) -> None:
    """Stop a driver that is still running (the lane timed out, or the test was interrupted):
    Ctrl-C first, so that its script's ``finally`` stops the app it started in a session of its
    own; then its process group (our own driver's) is killed."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _needs_the_bench_extra() -> None:
    """Skip without the ``bench`` extra (the eventsourcing peer, matplotlib for the plots);
    CI installs it (``.ci/run``)."""
    for module in ("eventsourcing", "matplotlib"):
        pytest.importorskip(module, reason="the bench extra: pip install -e '.[test,bench]'")


def test_every_bench_script_runs_at_a_tiny_size(cqrs_config: CqrsConfig, tmp_path: Path) -> None:
    _needs_the_bench_extra()
    results = tmp_path / "results"
    results.mkdir()
    env = {**os.environ, "CQRS_KAFKA_BOOTSTRAP": cqrs_config.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": cqrs_config.spark.checkpoint_dir}
    lanes = {"in-process lane": _in_process_lane(results), "app lane": _app_lane(results)}
    logs: dict[str, IO[str]] = {}
    procs = {}
    try:
        for lane, smokes in lanes.items():
            logs[lane] = (tmp_path / f"{lane.replace(' ', '-')}.log").open("w+")
            procs[lane] = subprocess.Popen(_driver_argv(smokes), cwd=ROOT, env=env, text=True,
                                           stdout=logs[lane], stderr=subprocess.STDOUT,
                                           start_new_session=True)
        deadline = time.monotonic() + LANES_TIMEOUT_S
        for proc in procs.values():
            proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pass  # the script that did not end is named below
    finally:
        for proc in procs.values():
            _interrupt(proc)
    problems = []
    for lane, smokes in lanes.items():
        logs[lane].seek(0)
        output = logs[lane].read()
        logs[lane].close()
        times = [line for line in output.splitlines() if line.startswith("SMOKE ") and " starts" not in line]
        print(f"{lane}: " + "; ".join(times))  # the seconds each took, for the curious (-s)
        lane_problems = _problems(lane, smokes, output, results)
        if lane_problems:
            problems += lane_problems + [f"{lane}'s output (end):\n{output[-6000:]}"]
    assert not problems, "\n".join(problems)


def test_the_report_redraws_a_results_file(tmp_path: Path) -> None:
    """``bench/report.py`` on a results file of every kind of row: the table and the four
    plots (the memory plot needs a throughput row of ours, which the smoke run above has not)."""
    _needs_the_bench_extra()
    memory = {"jvm_mib": 400.0, "workers_mib": 700.0, "workers": 4, "driver_mib": 150.0}
    rows = [
        {"system": "cqrs", "kind": "throughput", "aggregates": n, "commands": 1000,
         "seconds": 1.0 + n / 1000, "commands_per_s": round(1000 / (1.0 + n / 1000)),
         "loadavg": [1.0, 1.0, 1.0], "machine_pct": 150, "memory": memory} for n in (10, 100)]
    rows += [
        {"system": "spark floor", "kind": "throughput", "aggregates": 10, "commands": 1000,
         "seconds": 0.5, "commands_per_s": 2000},
        {"system": "eventsourcing popo", "kind": "throughput", "aggregates": 10, "commands": 1000,
         "seconds": 0.1, "commands_per_s": 10000, "peak_rss_mib": 80},
        {"system": "cqrs", "kind": "latency", "rate_per_s": 20.0, "seconds": 1.0, "aggregates": 10,
         "commands": 20, "p50_s": 0.1, "p99_s": 0.3, "max_s": 0.4,
         "rtt_s": [0.05 + i / 50 for i in range(20)]},
        {"system": "kafka streams", "kind": "latency", "rate_per_s": 20.0, "seconds": 1.0,
         "aggregates": 10, "commands": 20, "p50_s": 0.08, "p99_s": 0.16, "max_s": 0.22},
        {"system": "spark floor + mapInArrow", "kind": "latency", "error": "RuntimeError: boom"},
    ]
    sample = tmp_path / "20260101-000000.json"
    sample.write_text(json.dumps({"started": "2026-01-01T00:00:00", "machine": {"summary": "test"},
                                  "rows": rows}))
    out = _bench(["bench/report.py", str(sample), "--img-dir", str(tmp_path)], dict(os.environ), 120)
    assert "| cqrs | 1,000 commands, 10 aggregates |" in out and "failed: RuntimeError: boom" in out
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "processor-throughput.png", "processor-latency.png", "processor-latency-time.png",
        "processor-memory.png"}
    # the latency figure gives the distribution from every round trip where there are some
    assert "**p50 100 ms**, p90" in out and "p99.9" in out


# ---- bench/kstreams.py: what it reads from the Kafka Streams peer, on a sample of its output

# as /work/shared/peers/kstreams prints them (LoadGen.emit): Maven's output around them, and its
# first build's terminal escape before the first result, with no newline after it
PEER_STDOUT = "\n".join([
    "[INFO] BUILD SUCCESS",
    "\x1b[0m" + json.dumps({"peer": "kafka-streams", "mode": "throughput", "aggregates": 1000,
                            "commands": 100000, "seconds": 3.823, "commands_per_s": 26159,
                            "produce_seconds": 0.567, "rejected": 0, "duplicate_results": 0,
                            "cpu": {"window_s": 3.88, "kafka_s": 2.36, "processor_s": 3.62,
                                    "loadgen_s": 1.48, "machine_pct": 195, "others_pct": 3}}),
    "opening 1000 aggregates",
    json.dumps({"peer": "kafka-streams", "mode": "verify", "ok": True}),
    json.dumps({"peer": "kafka-streams", "mode": "latency", "rate_per_s": 500.0, "seconds": 30.0,
                "aggregates": 1000, "commands": 15000, "p50_ms": 79.5, "p99_ms": 159.7,
                "max_ms": 220.4, "rejected": 0, "duplicate_results": 0,
                "cpu": {"window_s": 30.13, "machine_pct": 55, "others_pct": 1}}),
    '{"peer": "kafka-streams", "mode": "throughput", "seconds": ',  # a line cut short
])


def test_the_kstreams_bench_reads_the_peers_results(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from kstreams import kstreams_rows, parse_lines
    finally:
        sys.path.remove(str(ROOT / "bench"))
    records = parse_lines(PEER_STDOUT.splitlines())
    assert [r["mode"] for r in records] == ["throughput", "latency"]
    throughput, latency = kstreams_rows(records, [1.0, 2.0, 3.0])
    assert throughput["system"] == "kafka streams" and throughput["commands_per_s"] == 26159
    assert throughput["machine_pct"] == 195 and throughput["loadavg"] == [1.0, 2.0, 3.0]
    assert (latency["p50_s"], latency["p99_s"], latency["max_s"]) == pytest.approx((0.0795, 0.1597, 0.2204))
    # the script itself, on a results file as the peer appends it (run/results.jsonl)
    sample = tmp_path / "results.jsonl"
    sample.write_text(PEER_STDOUT + "\n")
    printed = _bench(["bench/kstreams.py", str(sample)], dict(os.environ), 60)
    assert [json.loads(line)["kind"] for line in printed.splitlines()] == ["throughput", "latency"]


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
