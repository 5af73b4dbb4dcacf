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

__all__ = ["AppReferenceError", "app_reference", "load_app", "load_object"]


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


def app_reference(app: App | str) -> str:
    """The ``module:attribute`` reference of an App (Spark executors import an app by it): a
    reference is checked and returned; for an App object, the module whose top level built it
    (:attr:`App.defined_in`) when it holds the app, else the first importable module (fewest
    dots, then by name) that does. :class:`AppReferenceError` when no such module is loaded (an
    app built in ``__main__``, a notebook or a function)."""
    from cqrs.app import App

    if isinstance(app, str):
        load_app(app)
        return app
    if not isinstance(app, App):
        raise AppReferenceError(f"{app!r} is a {type(app).__name__}, not a cqrs App or a "
                                "'module:attribute' reference to one")
    home = sys.modules.get(app.defined_in or "") if app.defined_in != "__main__" else None
    if home is not None and getattr(home, "__spec__", None) is not None:
        for attribute, value in vars(home).items():
            if value is app:
                return f"{app.defined_in}:{attribute}"
    found = []
    for name, module in list(sys.modules.items()):
        # a module made in place (docs examples, notebooks) has no spec: executors cannot import it
        if name == "__main__" or getattr(module, "__spec__", None) is None:
            continue
        for attribute, value in list(vars(module).items()):
            if value is app:
                found.append((name.count("."), name, attribute))
    if not found:
        raise AppReferenceError(
            f"app {app.name!r} is not an attribute of any importable module, and Spark's "
            "executors import an app by 'module:attribute': define it at the top level of a "
            "module (e.g. myapp/__init__.py: app = App(...)) and pass that reference or the App")
    _, module_name, attribute = min(found)
    return f"{module_name}:{attribute}"
