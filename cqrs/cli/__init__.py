"""The ``cqrs`` command line. Parsing happens only when :func:`main` runs, never on import."""

from __future__ import annotations

from cqrs.cli.main import main

__all__ = ["main"]
