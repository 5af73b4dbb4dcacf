"""``cqrs demo`` as a user runs it: one command, exit 0, every check it prints passed."""

from __future__ import annotations

import os
import subprocess
import sys

from cqrs.config import CqrsConfig


def test_the_demo_runs_end_to_end_and_checks_itself(cqrs_config: CqrsConfig) -> None:
    env = {**os.environ, "CQRS_KAFKA_BOOTSTRAP": cqrs_config.kafka.bootstrap_servers,
           "CQRS_CASSANDRA_HOSTS": cqrs_config.cassandra.hosts,
           "CQRS_CASSANDRA_PORT": str(cqrs_config.cassandra.port)}
    done = subprocess.run([sys.executable, "-c", "from cqrs.cli import main; raise SystemExit(main(['demo']))"],
                          capture_output=True, text=True, timeout=900, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    assert "every check passed" in out
    assert "FAIL" not in out
    for claim in ("exactly one won", "the newest 30, newest first", "dead-letter topic",
                  "add up across stores", "equals generation 1", "ann holds three loans",
                  "lists her three loans"):
        assert claim in out
