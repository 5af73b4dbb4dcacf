"""The Kafka Streams peer (``/work/shared/peers/kstreams``, see its README): run its one
command and read its figures into rows of ``bench/processor.py``'s table.

``./run-bench.sh`` starts the peer's own Kafka (127.0.0.1:29092) when none runs and stops it
at the end; it runs 1,000 and 100,000 aggregates (or the ``aggregates`` given, its
``AGGREGATES``; max(N, 100,000) deposits each) and the 500/s, 30 s latency case, and prints
one JSON line per run (also appended to its ``run/results.jsonl``).
Never run it while our processor runs: the two would share the two cores.

    python bench/kstreams.py run/results.jsonl      # parse a results file, print the rows
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_DIR", "kstreams_rows", "parse_lines", "run_kstreams"]

DEFAULT_DIR = Path(os.environ.get("KSTREAMS_PEER_DIR", "/work/shared/peers/kstreams"))
SYSTEM = "kafka streams"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def parse_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The peer's JSON lines among ``lines`` (anything else skipped). A line may start with
    terminal escapes: Maven's first build prints ``ESC[0m`` to stdout with no newline, which
    prefixes the first result line."""
    found = []
    for line in lines:
        line = ANSI_ESCAPE.sub("", line).strip()
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if record.get("peer") == "kafka-streams" and record.get("mode") in ("throughput", "latency"):
            found.append(record)
    return found


def to_row(record: dict[str, Any], loadavg: list[float] | None) -> dict[str, Any]:
    """One peer record as a row of the summary (seconds, not milliseconds, like ours); the
    load average noted before its run when :func:`run_kstreams` saw it, else ``loadavg``."""
    cpu = record.get("cpu") or {}
    row: dict[str, Any] = {"system": SYSTEM, "kind": record["mode"], "aggregates": record.get("aggregates"),
                           "commands": record.get("commands"), "loadavg": record.get("loadavg", loadavg),
                           "machine_pct": cpu.get("machine_pct"), "others_pct": cpu.get("others_pct"),
                           "cpu": cpu}
    if record["mode"] == "throughput":
        row.update(seconds=record["seconds"], commands_per_s=record["commands_per_s"],
                   produce_seconds=record.get("produce_seconds"))
    else:
        row.update(rate_per_s=record.get("rate_per_s"), seconds=record.get("seconds"),
                   p50_s=record["p50_ms"] / 1000, p99_s=record["p99_ms"] / 1000,
                   max_s=record["max_ms"] / 1000)
    return row


def kstreams_rows(records: list[dict[str, Any]], loadavg: list[float] | None) -> list[dict[str, Any]]:
    return [to_row(r, loadavg) for r in records]


def run_kstreams(peer_dir: Path = DEFAULT_DIR, timeout_s: float = 1800,
                 aggregates: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """Run ``./run-bench.sh`` in ``peer_dir`` (its progress on our stderr) and return its records,
    each with the load average noted before its run (``loadavg``). ``aggregates``: the sizes of
    its throughput runs (default: its own, 1,000 and 100,000).

    Its stdout is read line by line as it comes, so a run that fails half-way still gives the
    records printed before; a non-zero exit is reported after them.
    """
    script = peer_dir / "run-bench.sh"
    if not script.exists():
        raise FileNotFoundError(f"{script} not found: set KSTREAMS_PEER_DIR or --kstreams-dir")
    results_file = peer_dir / "run" / "results.jsonl"
    offset = results_file.stat().st_size if results_file.exists() else 0
    started = time.monotonic()
    env = dict(os.environ)
    if aggregates is not None:
        env["AGGREGATES"] = " ".join(str(n) for n in aggregates)
    proc = subprocess.Popen(["./run-bench.sh"], cwd=peer_dir, stdout=subprocess.PIPE,
                            stderr=sys.stderr, text=True, env=env)
    # our own child, by its handle; its EXIT trap stops what it started
    timer = threading.Timer(timeout_s, proc.terminate)
    timer.start()
    records: list[dict[str, Any]] = []
    before = _load()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            for record in parse_lines([line]):
                print(f"  kafka streams: {line.strip()}", flush=True)
                records.append({**record, "loadavg": before})
                before = _load()
        code = proc.wait()
    finally:
        timer.cancel()
    print(f"  kafka streams: done in {time.monotonic() - started:.0f} s", flush=True)
    if code != 0:
        print(f"  kafka streams: ./run-bench.sh exited {code} after {len(records)} result(s)", flush=True)
    return _with_appended(records, results_file, offset)


def _with_appended(seen: list[dict[str, Any]], results_file: Path, offset: int) -> list[dict[str, Any]]:
    """The records this run appended to ``run/results.jsonl`` (the peer's own copy of its
    stdout), each with its load average where it was seen on stdout: nothing is lost if a
    stdout line was mangled."""
    if not results_file.exists():
        return seen
    with results_file.open("rb") as f:
        f.seek(offset)
        appended = parse_lines(f.read().decode(errors="replace").splitlines())
    if len(appended) <= len(seen):
        return seen
    loads = [(({k: v for k, v in r.items() if k != "loadavg"}), r.get("loadavg")) for r in seen]
    return [{**r, "loadavg": next((load for rec, load in loads if rec == r), None)} for r in appended]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]

if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR / "run" / "results.jsonl"
    for row in kstreams_rows(parse_lines(path.read_text().splitlines()), None):
        print(json.dumps(row))
