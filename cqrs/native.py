"""The optional native module, ``cqrs_native`` (``native/`` in the repository, Rust): the
pieces of the processor's per-command path that it does faster. Each module that uses one keeps
its own Python code for it, used when the module is not installed (``pip install ./native``,
needs Rust's cargo), and the tests check that both give the same results."""

from __future__ import annotations

from types import ModuleType
from typing import Final

__all__ = ["FORM", "native"]

FORM: Final = 1  # the functions and plans this code calls cqrs_native with

native: ModuleType | None
try:
    import cqrs_native as native
except ImportError:  # pragma: no cover - the Python code serves then
    native = None
if native is not None and getattr(native, "FORM", None) != FORM:  # pragma: no cover
    native = None  # a build of another version of the framework: it may take other arguments
