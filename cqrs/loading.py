"""Find an :class:`~cqrs.app.App` from a ``module:attribute`` reference (CLI and Spark executors)."""

from __future__ import annotations

import importlib
import os
import sys
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
        raise AppReferenceError(_import_failure(module_name, reference, exc)) from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise AppReferenceError(
            f"module {module_name!r} has no {what} {attribute!r} (from {reference!r})"
        ) from None


def _import_failure(module_name: str, reference: str, exc: ImportError) -> str:
    """Why ``module_name`` did not import, and what to do. A top-level module missing from
    Python's path is the usual case: the ``cqrs`` command's path does not hold the current
    directory. A module that was found and failed inside keeps its own error."""
    message = f"cannot import module {module_name!r} of {reference!r}: {exc}"
    top = module_name.partition(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or exc.name != top:
        return message
    cwd = os.getcwd()
    if any(os.path.abspath(p or ".") == cwd for p in sys.path):
        return (f"{message}. The current directory ({cwd}) is on Python's path but holds no "
                f"{top}.py or {top}/: run from the folder that holds it, or check the name")
    return (f"{message}. Python looks for {top!r} on its path, which does not hold the current "
            f"directory ({cwd}) when you run `cqrs`: run from the folder that holds {top}.py or "
            f"{top}/ with PYTHONPATH=. (`PYTHONPATH=. cqrs ...`, or `export PYTHONPATH=.` once), "
            "or install your package into this environment (`pip install -e .`)")


@cache
def load_app(reference: str) -> App:
    """Import ``package.module:attribute`` and return the App it names (cached per process)."""
    from cqrs.app import App

    app = load_object(reference, "attribute")
    if not isinstance(app, App):
        raise AppReferenceError(f"{reference!r} is a {type(app).__name__}, not a cqrs App")
    return app
