"""The benchmark programs run, at a tiny size, so that one cannot rot unseen between the
quiet-machine runs that take their figures (bench/projector.py once crashed after its first
part for a whole round). Their figures are not looked at here: CI must not depend on the speed
of a shared machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cqrs.config import CqrsConfig

ROOT = Path(__file__).resolve().parents[2]


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


def test_the_projector_bench_runs(cqrs_config: CqrsConfig) -> None:
    env = {**os.environ, "CQRS_KAFKA_BOOTSTRAP": cqrs_config.kafka.bootstrap_servers}  # it names its own topics
    out = _bench(["bench/projector.py", "--stream-events", "1000", "--rebuild-events", "1000",
                  "--accounts", "50"], env, 600)
    assert "RESULT steady stream" in out and "RESULT rebuild of 1,000 events" in out, out[-3000:]


def test_the_processor_bench_with_personal_fields_runs(cqrs_config: CqrsConfig, tmp_path: Path) -> None:
    env = {**os.environ, "CQRS_KAFKA_BOOTSTRAP": cqrs_config.kafka.bootstrap_servers}
    out = _bench(["bench/processor.py", "--personal", "--aggregates", "20", "--commands", "500",
                  "--rounds", "1", "--no-warm-up", "--results-dir", str(tmp_path)], env, 600)
    assert "RESULT personal round 1, 20 aggregates: plain" in out, out[-3000:]
    assert "RESULT personal / plain:" in out and list(tmp_path.glob("*.json"))


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
