"""Finding the methods a handler or process manager declares: public functions of the class and
its bases below ``base``, each with its resolved type hints and parameters (a subclass's method
hides a base's of the same name)."""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterator
from typing import Any

from cqrs.errors import HandlerSignatureError

__all__ = ["typed_methods", "union_members"]


def typed_methods(obj: object, base: type) -> Iterator[tuple[type, str, Any, dict[str, Any],
                                                           list[inspect.Parameter]]]:
    """``(class, name, function, hints, parameters)`` of each public method of ``obj``'s class
    defined in a subclass of ``base``; unresolvable type hints raise HandlerSignatureError."""
    seen: set[str] = set()
    for klass in type(obj).__mro__:
        if klass is base or not issubclass(klass, base):
            continue
        for name, fn in vars(klass).items():
            if name.startswith("_") or name in seen or not inspect.isfunction(fn):
                continue
            seen.add(name)
            try:
                hints = typing.get_type_hints(fn)
            except Exception as exc:
                raise HandlerSignatureError(
                    f"type hints of {klass.__qualname__}.{name} cannot be resolved ({exc}): "
                    "import every class its annotations name into the module, and define "
                    "messages, handlers and process managers at module level"
                ) from exc
            yield klass, name, fn, hints, list(inspect.signature(fn).parameters.values())


def union_members(hint: Any) -> tuple[Any, ...]:
    """The members of a union annotation (``A | B`` or ``typing.Union[A, B]``, ``Optional``
    included); ``()`` for any other annotation."""
    if typing.get_origin(hint) is typing.Union or isinstance(hint, types.UnionType):
        return typing.get_args(hint)
    return ()
