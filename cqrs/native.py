"""The optional native module, ``cqrs_native`` (``native/`` in the repository, Rust): the
pieces of the processor's per-command path that it does faster. Each module that uses one keeps
its own Python code for it, used when the module is not installed (``pip install ./native``,
needs Rust's cargo), and the tests check that both give the same results."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Final, TypeVar

import attrs

__all__ = ["FORM", "builder", "native"]

T = TypeVar("T")

FORM: Final = 3  # the functions and plans this code calls cqrs_native with

native: ModuleType | None
try:
    import cqrs_native as native
except ImportError:  # pragma: no cover - the Python code serves then
    native = None
if native is not None and getattr(native, "FORM", None) != FORM:  # pragma: no cover
    native = None  # a build of another version of the framework: it may take other arguments


def builder(cls: type[T]) -> Callable[..., T]:
    """``make(*values)``: the instance of the frozen attrs class ``cls`` whose ``__init__``
    arguments are ``values``, all of them, in order: ``cls`` itself, or, with the native module,
    a maker that sets the fields without the class's ``__init__`` (a frozen class's sets each
    field through ``object.__setattr__``; ~3x quicker for the per-command path's objects).
    Only for a class whose ``__init__`` does nothing else: no validator, converter or init
    hook, and only plain defaults for the fields it does not take (else ``cls`` itself)."""
    if native is None or not attrs.has(cls) or hasattr(cls, "__attrs_pre_init__") \
            or hasattr(cls, "__attrs_post_init__"):
        return cls
    names: list[str] = []
    defaults: list[tuple[str, object]] = []
    for f in attrs.fields(cls):
        if f.validator is not None or f.converter is not None:
            return cls
        if f.init:
            names.append(f.name)
        elif f.default is attrs.NOTHING or isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
            return cls
        else:
            defaults.append((f.name, f.default))
    return native.Builder(cls, names, defaults)  # type: ignore[no-any-return]
