"""Stable type names and class versions: validation and the private attribute names."""

from __future__ import annotations

import re

from cqrs.errors import InvalidTypeNameError

__all__ = ["TYPE_ATTR", "VERSION_ATTR", "KIND_ATTR", "TERMINAL_ATTR", "SUBJECT_ATTR", "check_type_name", "check_version", "default_type_name", "snake_case"]

TYPE_ATTR = "__cqrs_type__"
VERSION_ATTR = "__cqrs_version__"
KIND_ATTR = "__cqrs_kind__"
TERMINAL_ATTR = "__cqrs_terminal__"
SUBJECT_ATTR = "__cqrs_subject__"  # the field naming whose personal data a class holds

_TYPE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*([.\-][A-Za-z_][A-Za-z0-9_]*)*$")
_CAMEL_1 = re.compile(r"(.)([A-Z][a-z]+)")
_CAMEL_2 = re.compile(r"([a-z0-9])([A-Z])")


def default_type_name(cls: type) -> str:
    """``module.QualName`` with ``<locals>`` parts dropped, e.g. ``bank.model.Deposited``."""
    qual = ".".join(p for p in cls.__qualname__.split(".") if p != "<locals>")
    return f"{cls.__module__}.{qual}"


def check_type_name(name: object, cls: type) -> str:
    """Return ``name`` if it is a dotted identifier path, else raise :class:`InvalidTypeNameError`."""
    if not isinstance(name, str) or not _TYPE_NAME.match(name):
        raise InvalidTypeNameError(
            f"type name {name!r} of {cls.__qualname__} is invalid: use dotted identifiers "
            "such as 'bank.Deposited' (letters, digits, '_', separated by '.' or '-')"
        )
    return name


def check_version(version: object, cls: type) -> int:
    """Return ``version`` if it is an int >= 1, else raise :class:`InvalidTypeNameError`."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidTypeNameError(
            f"version {version!r} of {cls.__qualname__} is invalid: use an int >= 1 "
            "and increase it by one when the shape changes"
        )
    return version


def snake_case(name: str) -> str:
    """``MoneyDeposited`` -> ``money_deposited``."""
    return _CAMEL_2.sub(r"\1_\2", _CAMEL_1.sub(r"\1_\2", name)).lower()
