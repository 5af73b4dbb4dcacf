"""Personal data: fields declared ``personal()`` and the data subject they belong to.

>>> @event(subject="customer_id")
... class CustomerRegistered:
...     customer_id: str
...     email: str = personal()
...     nickname: str | None = personal(default=None, replacement="")

The *data subject* is the person the data is about, named by one ``str`` field of the same
class (``@command(subject=...)``, ``@event(subject=...)``, ``class C(Aggregate, subject=...)``).
Declaring is all the domain does: the codec (:mod:`cqrs.personal`) encrypts those fields with
the subject's own key before they are written, and reads them as their ``replacement`` once the
subject's key is forgotten. This module reads and checks declarations; it knows no cryptography.
"""

from __future__ import annotations

import threading
import types
import typing
from collections.abc import Iterator
from typing import Any

import attrs

from cqrs.domain._names import KIND_ATTR, SUBJECT_ATTR
from cqrs.errors import PersonalDataDeclarationError

__all__ = [
    "FORGOTTEN",
    "Personal",
    "PersonalFields",
    "data_subject",
    "personal",
    "personal_fields",
]

FORGOTTEN = "<forgotten>"
"""What a personal field reads as, by default, once its subject is forgotten."""

_METADATA_KEY = "cqrs.personal"


@attrs.frozen
class Personal:
    """The mark ``personal()`` leaves in a field's attrs metadata."""

    replacement: str = FORGOTTEN


def personal(*, default: Any = attrs.NOTHING, replacement: str = FORGOTTEN) -> Any:
    """Declare an attrs field personal data: ``email: str = personal()``.

    The field is written encrypted with the key of the class's data subject, and reads as
    ``replacement`` once that key is forgotten. Allowed on ``str`` and ``str | None`` fields
    (``None`` is written as it is: not encrypted).
    """
    if not isinstance(replacement, str):
        raise PersonalDataDeclarationError(
            f"personal(replacement={replacement!r}): the replacement is the text a forgotten "
            "value reads as: give a str"
        )
    return attrs.field(default=default, metadata={_METADATA_KEY: Personal(replacement)})


@attrs.frozen
class PersonalFields:
    """A class's checked declaration: its subject field and its personal fields, each with
    the text it reads as once forgotten."""

    cls: type
    subject: str
    fields: tuple[tuple[str, str], ...]  # (field name, replacement)


def data_subject(cls: type) -> str | None:
    """The name of the field holding the data subject of ``cls``, if it declares one."""
    found = getattr(cls, SUBJECT_ATTR, None)
    return found if isinstance(found, str) else None


def check_subject(subject: object, cls: type) -> str | None:
    """``subject`` as given to a decorator or class keyword (a field name or None)."""
    if subject is None or (isinstance(subject, str) and subject.isidentifier()):
        return subject
    raise PersonalDataDeclarationError(
        f"subject={subject!r} of {cls.__qualname__}: name the field that holds the data "
        "subject's id, e.g. subject='customer_id'"
    )


_CACHE: dict[type, PersonalFields | None] = {}
_LOCK = threading.Lock()
_UNKNOWN = object()


def personal_fields(cls: type) -> PersonalFields | None:
    """The checked personal-data declaration of an attrs class (None: it holds none).

    Raises :class:`PersonalDataDeclarationError` for a declaration the codec could not
    honour: a personal field without a subject, a subject that is no ``str`` field or is
    personal itself, a personal field that is not ``str`` / ``str | None``, or a personal
    field in a value nested in ``cls`` (only top-level fields are encrypted).
    """
    found = _CACHE.get(cls, _UNKNOWN)  # one dict read: it runs once per event folded
    if found is not _UNKNOWN:
        return found  # type: ignore[return-value]
    found = _declaration(cls)
    with _LOCK:
        _CACHE[cls] = found
    return found


def _marked(cls: type) -> list[tuple[str, Personal]]:
    return [(a.name, a.metadata[_METADATA_KEY]) for a in attrs.fields(cls)
            if _METADATA_KEY in a.metadata]


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise PersonalDataDeclarationError(
            f"type hints of {cls.__module__}.{cls.__qualname__} cannot be resolved ({exc}): "
            "define the class and the types it uses at module level"
        ) from exc


def _declaration(cls: type) -> PersonalFields | None:
    if not attrs.has(cls):
        return None
    marked = _marked(cls)
    subject = data_subject(cls)
    hints = _hints(cls) if marked or subject is not None else {}
    where = cls.__qualname__
    _refuse_nested(cls, set())
    if marked and cls.__dict__.get(KIND_ATTR) not in ("command", "event", "aggregate"):
        raise PersonalDataDeclarationError(
            f"{where}.{marked[0][0]} is personal(), but {where} is neither a command, an event "
            "nor an aggregate (a process manager's state, a nested value...): personal fields "
            "are supported on commands, events and aggregates only for now; keep the data "
            "there"
        )
    if marked and subject is None:
        raise PersonalDataDeclarationError(
            f"{where}.{marked[0][0]} is personal(), but {where} names no data subject (whose "
            "data it is, whose key encrypts it): add subject='<field holding the person's id>'"
            " to its @command / @event decorator, or to the class line of an aggregate: "
            f"class {cls.__name__}(Aggregate, subject='customer_id')"
        )
    if subject is None:
        return None
    names = [a.name for a in attrs.fields(cls)]
    if subject not in names:
        raise PersonalDataDeclarationError(
            f"{where} names {subject!r} as its data subject, but has no such field: name one "
            f"of its fields {names}, the one holding the person's id"
        )
    if not _is_str(hints.get(subject)):
        raise PersonalDataDeclarationError(
            f"the data subject {where}.{subject} is typed {hints.get(subject)!r}: it must be a "
            "str field (the person's id, e.g. a customer id), never None: personal data always "
            "belongs to someone"
        )
    for name, _ in marked:
        if name == subject:
            raise PersonalDataDeclarationError(
                f"{where}.{name} is both the data subject and personal(): the subject's id stays "
                "readable (it finds the key); make the subject an id that is not personal data"
            )
        if not _is_str(hints.get(name), optional=True):
            raise PersonalDataDeclarationError(
                f"{where}.{name} is personal() but typed {hints.get(name)!r}: personal fields "
                "are str or str | None for now (they are written as encrypted text); keep the "
                "value as text (e.g. a date in ISO format) or leave it out of the message"
            )
    if not marked:
        return None
    return PersonalFields(cls, subject, tuple((n, p.replacement) for n, p in marked))


def _strip(hint: Any) -> Any:
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _is_str(hint: Any, *, optional: bool = False) -> bool:
    hint = _strip(hint)
    if hint is str:
        return True
    if optional and typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        return len(args) == 2 and type(None) in args and any(
            _strip(a) is str for a in args)
    return False


def _attrs_classes_in(hint: Any) -> Iterator[type]:
    hint = _strip(hint)
    if isinstance(hint, type):
        if attrs.has(hint):
            yield hint
        return
    for arg in typing.get_args(hint):
        yield from _attrs_classes_in(arg)


def _refuse_nested(cls: type, seen: set[type]) -> None:
    """Refuse a personal field in any attrs value nested in ``cls``'s fields."""
    seen.add(cls)
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # noqa: BLE001 - the codec names unresolvable hints when it meets them
        return
    for a in attrs.fields(cls):
        for inner in _attrs_classes_in(hints.get(a.name)):
            if inner in seen:
                continue
            marked = _marked(inner)
            if marked:
                raise PersonalDataDeclarationError(
                    f"{inner.__qualname__}.{marked[0][0]} is personal(), and {inner.__qualname__} "
                    f"is nested in {cls.__qualname__}.{a.name}: only the top-level fields of a "
                    "command, event or aggregate are encrypted for now; move the field up to "
                    f"{cls.__qualname__}"
                )
            _refuse_nested(inner, seen)
