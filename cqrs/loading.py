"""Find an :class:`~cqrs.app.App` from a ``module:attribute`` reference (CLI and Spark executors)."""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING, Any

from cqrs.errors import CqrsError

if TYPE_CHECKING:
    from cqrs.app import App

__all__ = ["AppReferenceError", "load_app", "load_object"]


class AppReferenceError(CqrsError, LookupError):
    """``module:attribute`` does not name an App (or the object asked for)."""


def load_object(reference: str, what: str = "object") -> Any:
    """Import ``package.module:attribute`` and return the attribute."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise AppReferenceError(
            f"{reference!r} is not a module:attribute reference; write e.g. "
            "'domain_examples.bank:app'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppReferenceError(f"cannot import module {module_name!r} of {reference!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise AppReferenceError(
            f"module {module_name!r} has no {what} {attribute!r} (from {reference!r})"
        ) from None


@cache
def load_app(reference: str) -> App:
    """Import ``package.module:attribute`` and return the App it names (cached per process)."""
    from cqrs.app import App

    app = load_object(reference, "attribute")
    if not isinstance(app, App):
        raise AppReferenceError(f"{reference!r} is a {type(app).__name__}, not a cqrs App")
    return app
