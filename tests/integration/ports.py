"""A port for a server a test starts later (a status page, an HTTP API, a metrics endpoint)."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port"]

# below the kernel's ephemeral range (32768 and up on Linux) and below every port of the local
# stacks (17000 and up: see the ports of cqrs.config's [dev] settings)
_LOW, _HIGH = 11000, 17000


def free_port() -> int:
    """A TCP port nothing listens on now, from a band no outgoing connection uses: a port the
    kernel hands out for ``bind(0)`` is in its ephemeral range, where any client connection
    made meanwhile (Kafka's, Cassandra's) may take it as its local port, and the server then
    fails to start with 'Address already in use'."""
    rng = random.SystemRandom()
    for _ in range(500):
        port = rng.randrange(_LOW, _HIGH)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {_LOW} and {_HIGH}: what holds them all?")
