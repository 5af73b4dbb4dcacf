"""``cqrs demo`` as a user runs it: one command, exit 0, every check it prints passed."""

from __future__ import annotations

import os
import subprocess
import sys

from cqrs.config import CqrsConfig

# The demo, then the connections its process still holds to Kafka and Cassandra (sockets of the
# process whose remote port is one of argv's). A client left open keeps one; on a machine where
# the demo started the stack, each then logged "Connection refused" after the stack stopped.
DEMO_THEN_OPEN_SOCKETS = """
import os, sys
from cqrs.cli import main
code = main(["demo"])
ports = {int(p) for p in sys.argv[1:]}
mine = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if target.startswith("socket:["):
        mine.add(target[len("socket:["):-1])
held = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as rows:
        for row in rows.read().splitlines()[1:]:
            cols = row.split()
            if cols[9] in mine and int(cols[2].rsplit(":", 1)[1], 16) in ports:
                held.append(int(cols[2].rsplit(":", 1)[1], 16))
print(f"connections left to the stack: {sorted(held)}", file=sys.stderr)
raise SystemExit(code)
"""


def test_the_demo_runs_end_to_end_and_checks_itself(cqrs_config: CqrsConfig) -> None:
    env = {**os.environ, "CQRS_KAFKA_BOOTSTRAP": cqrs_config.kafka.bootstrap_servers,
           "CQRS_CASSANDRA_HOSTS": cqrs_config.cassandra.hosts,
           "CQRS_CASSANDRA_PORT": str(cqrs_config.cassandra.port),
           # the rebuild drops the old generation 1 s after the switch, not 5 s (the default,
           # for readers elsewhere to move over: the demo has none), as the projector tests do
           "CQRS_PROJECTIONS_DROP_GRACE": "1"}
    ports = {int(b.rsplit(":", 1)[1]) for b in cqrs_config.kafka.bootstrap_servers.split(",")}
    ports.add(cqrs_config.cassandra.port)
    done = subprocess.run([sys.executable, "-c", DEMO_THEN_OPEN_SOCKETS, *map(str, sorted(ports))],
                          capture_output=True, text=True, timeout=900, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    # every client is closed before the demo would stop a stack it started
    assert "connections left to the stack: []" in done.stderr, done.stderr[-4000:]
    assert "every check passed" in out
    assert "FAIL" not in out
    for claim in ("exactly one won", "the newest 30, newest first", "dead-letter topic",
                  "add up across stores", "equals generation 1", "ann holds three loans",
                  "lists her three loans", "reads <forgotten> (key deleted, row rewritten)",
                  "holds only ciphertext of the names"):
        assert claim in out
