"""Sealing and opening the personal fields of one class's instances (what the codec calls).

:meth:`FieldSealer.seal` gives a copy of a message whose personal ``str`` values are sealed
texts (:mod:`cqrs.personal.cipher`), with one key look-up for all its fields;
:meth:`FieldSealer.open` gives back a copy with the plain values, or each field's replacement
when the key that sealed it is gone. Copies are made without calling ``__init__`` (a validator
of the field would see a sealed text or a replacement), and only when a value changes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import attrs

from cqrs.domain.personal import PersonalFields
from cqrs.errors import EncodeError, MissingKeyStoreError, TamperedDataError
from cqrs.personal.cipher import OpenedText, open_sealed, parse_sealed, remember, seal_text, sealed_as
from cqrs.personal.keys import KeyCache, KeyStore

__all__ = ["FieldSealer"]

_new, _set = object.__new__, object.__setattr__  # copies bypass __init__ and frozen classes


class FieldSealer:
    """Seals and opens the personal fields of instances of ``declared.cls``, written under
    the stable ``type_name``, with the keys of ``key_store`` (None: every call raises
    :class:`MissingKeyStoreError`)."""

    def __init__(self, declared: PersonalFields, type_name: str, key_store: KeyStore | None) -> None:
        self.cls = declared.cls
        self.subject = declared.subject
        self.fields = declared.fields
        self.type_name = type_name
        self.key_store = key_store
        self._names = tuple(a.name for a in attrs.fields(self.cls))
        self.names = tuple(name for name, _ in self.fields)  # the personal fields
        self._replacements = tuple(replacement for _, replacement in self.fields)
        getter = operator.attrgetter(*self.names)
        self._get: Any = getter if len(self.names) > 1 else (lambda obj: (getter(obj),))
        self._has_dict = any("__dict__" in vars(k) for k in self.cls.__mro__)
        self.sealed_values: Callable[[Any], tuple[Any, ...] | None] = self._usual_first()

    def _usual_first(self) -> Callable[[Any], tuple[Any, ...] | None]:
        """:meth:`_sealed_values`, with its usual cases first in a function generated for this
        class, found with attribute reads and compares:

        - every personal value is an :class:`OpenedText` of this subject and field (the event
          a handler makes from a state's values, the state written back): their sealed texts,
          without the key cache (an event and its state: ~0.5 us instead of 1.9 at 100,000
          subjects, mostly memory: each command touched another subject's key entry);
        - with a :class:`KeyCache`: the values the subject's cached key sealed last (the
          event a command writes and the state after it carry the same person's values), with
          the cache's look-up and a tuple compare.

        Anything else goes to :meth:`_sealed_values`."""
        namespace = {"slow": self._sealed_values, "Opened": OpenedText, "names": self.names}
        reads = "".join(f"        v{i} = obj.{name}\n" for i, name in enumerate(self.names))
        values = "".join(f"v{i}, " for i in range(len(self.names)))
        opened = " and \\\n            ".join(
            f"type(v{i}) is Opened and v{i}.field == {name!r} and v{i}.subject == subject"
            for i, name in enumerate(self.names))
        texts = "".join(f"v{i}.sealed, " for i in range(len(self.names)))
        source = (
            "def sealed_values(obj):\n"
            "    try:\n"
            f"{reads}"
            f"        subject = obj.{self.subject}\n"
            "    except AttributeError:\n"
            "        return slow(obj)\n"
            f"    if {opened}:\n"
            f"        return ({texts})\n"
        )
        if isinstance(self.key_store, KeyCache):
            namespace["cached"] = self.key_store.cached
            source += (
                "    if type(subject) is str:\n"
                "        key = cached(subject)\n"
                "        if key is not None:\n"
                "            last = key._last\n"
                f"            if last is not None and last[1] == ({values}) and \\\n"
                "                    last[2] == subject and last[0] == names:\n"
                "                return last[3]\n"
            )
        source += "    return slow(obj)\n"
        exec(compile(source, f"<cqrs sealed values of {self.type_name}>", "exec"), namespace)  # noqa: S102
        return namespace["sealed_values"]  # type: ignore[no-any-return]

    def _keys(self) -> KeyStore:
        if self.key_store is None:
            raise MissingKeyStoreError(
                f"{self.type_name} has personal fields ({', '.join(f for f, _ in self.fields)}) "
                "and this codec has no key store to encrypt or decrypt them: bind one with "
                "app.use_key_store(...) (a KeyCache over CassandraKeyStore, see "
                "cqrs.personal.open_key_store; MemoryKeyStore in tests) or pass "
                "app.codec_for(store, key_store=...)"
            )
        return self.key_store

    def _subject(self, obj: Any) -> str:
        subject = getattr(obj, self.subject)
        if type(subject) is not str or not subject:
            raise EncodeError(
                f"{self.type_name}.{self.subject} = {subject!r} is the data subject of its "
                "personal fields: give the person's id, a non-empty str"
            )
        return subject

    def _copy(self, obj: Any, changes: dict[str, Any] | None = None) -> Any:
        new = _new(self.cls)
        if self._has_dict:  # an aggregate: attributes besides the fields go along
            new.__dict__.update(obj.__dict__)
        for name in self._names:
            _set(new, name, getattr(obj, name))
        if changes:
            for name, value in changes.items():
                _set(new, name, value)
        return new

    def _sealed_values(self, obj: Any) -> tuple[Any, ...] | None:
        """:attr:`sealed_values`: the values of ``obj``'s personal fields (in the order of
        :attr:`names`) as they are written: sealed, or as they are when None, empty or their
        replacement (which say nothing about the person and need no key); None when no value
        needs sealing (a new aggregate's state, before its subject is known, is such). A value
        opened from this subject's field (:class:`OpenedText`) is its sealed text. Runs
        once per event and state written: one key look-up, and values the key sealed lately
        (for any type with these field names) cost a dict look-up (the key's memo, see
        seal_text; don't change what it returns)."""
        values = self._get(obj)
        subject = getattr(obj, self.subject, None)
        if isinstance(self.key_store, KeyCache) and type(subject) is str and subject:
            # the usual case first: values this subject's cached key sealed lately (they were
            # checked then); no key is made or asked for here
            cached = self.key_store.cached(subject)
            found = None
            if cached is not None:
                last = cached._last  # noqa: SLF001 - the cipher's memo
                if last is not None and last[1] == values and last[0] == self.names and \
                        last[2] == subject:
                    return last[3]  # type: ignore[no-any-return]
                try:
                    found = cached._sealed.get((self.names, values, subject))  # noqa: SLF001
                except TypeError:  # an unhashable value: the checks below say what
                    pass
            if found is not None:
                cached._last = (self.names, values, subject, found)  # noqa: SLF001
                return found  # type: ignore[no-any-return]
        plain = opened = False
        for name, value, replacement in zip(self.names, values, self._replacements):
            if not value or value == replacement:
                continue
            if sealed_as(value, subject, name) is not None:
                opened = True  # written as its sealed text (see OpenedText)
                continue
            if not isinstance(value, str):
                raise EncodeError(
                    f"{self.type_name}.{name} = {value!r} ({type(value).__qualname__}) "
                    "is personal data, declared str: pass a str"
                )
            plain = True
        if not plain:
            return None if not opened else tuple(
                sealed_as(value, subject, name) or value
                for name, value in zip(self.names, values))
        subject = self._subject(obj)
        key = (self.key_store if self.key_store is not None
               else self._keys()).get_or_create(subject)
        memo = key._sealed  # noqa: SLF001 - the cipher's memo
        # the type is not bound (see cqrs.personal.cipher): an event and the state that copy a
        # person's values under the same field names share the entry
        wanted: tuple[Any, ...] | None = (self.names, values, subject)
        try:
            found = memo.get(wanted)
        except TypeError:  # an unhashable value besides (an empty list...): not remembered
            found = wanted = None
        if found is not None:
            return found  # type: ignore[no-any-return]
        out = tuple(value if not value or value == replacement
                    else sealed_as(value, subject, name) or seal_text(key, value, subject, name)
                    for name, value, replacement in zip(self.names, values, self._replacements))
        if wanted is not None:
            remember(memo, wanted, out)
            key._last = (*wanted, out)  # noqa: SLF001
        return out

    def copy_with(self, obj: Any, values: tuple[Any, ...]) -> Any:
        """A copy of ``obj`` with its personal fields set to ``values`` (:meth:`sealed_values`)."""
        return self._copy(obj, dict(zip(self.names, values)))

    def seal(self, obj: Any) -> Any:
        """``obj`` with its personal values sealed (itself when none needs it: see
        :meth:`sealed_values`)."""
        values = self.sealed_values(obj)
        return obj if values is None else self.copy_with(obj, values)

    def open_record(self, record: dict[str, Any], written_as: str) -> dict[str, Any]:
        """An Avro record of an older version (as written under the type name ``written_as``,
        before its upcasters run) with the sealed values of this class's personal fields
        opened, or replaced when their key is gone: upcasters see the plaintext (or the
        replacement), as appliers and handlers do. A field or subject the old record does not
        have is left as it is (a field renamed by an upcaster is not supported)."""
        opened: dict[str, Any] | None = None
        subject = record.get(self.subject)
        for name, replacement in self.fields:
            value = record.get(name)
            if type(value) is not str:
                continue
            sealed = parse_sealed(value, f"{written_as}.{name}")
            if sealed is None:
                continue
            if not isinstance(subject, str) or not subject:
                raise TamperedDataError(
                    f"{written_as}.{name} is sealed but the record's {self.subject!r} (the data "
                    f"subject) is {subject!r}: the record was changed after it was written")
            key = self._keys().key_for(subject, sealed.key_id)
            if opened is None:
                opened = dict(record)
            opened[name] = replacement if key is None else \
                open_sealed(key, sealed, value, subject, written_as, name)
        return record if opened is None else opened

    def open(self, obj: Any, written_as: str | None = None) -> Any:
        """``obj`` (as decoded) with its sealed values opened, or replaced when their key is
        gone. ``written_as``: the type name the data was written under, when an upcaster
        renamed it (the name is part of what the ciphertext is bound to)."""
        key_store = self._keys()
        type_name = written_as or self.type_name
        changes: dict[str, str] = {}
        subject: str | None = None
        keys: dict[bytes, Any] = {}
        exact = True  # every value with content sealed in format 2 and opened with one key
        for name, replacement in self.fields:
            value = getattr(obj, name)
            if type(value) is not str:
                exact = exact and not value
                continue
            sealed = parse_sealed(value, f"{type_name}.{name}")
            if sealed is None:  # written in clear, before the field was declared personal
                exact = exact and (not value or value == replacement)
                continue
            if subject is None:
                subject = self._subject(obj)
            if sealed.key_id not in keys:
                keys[sealed.key_id] = key_store.key_for(subject, sealed.key_id)
            key = keys[sealed.key_id]
            exact = exact and key is not None and sealed.version == 2
            changes[name] = replacement if key is None else \
                open_sealed(key, sealed, value, subject, type_name, name)
        if not changes:
            return obj
        opened = self._copy(obj, changes)
        if exact and len(keys) == 1:  # sealing the opened values gives these texts again:
            key = next(iter(keys.values()))  # what sealed_values finds (its memo's entry)
            try:
                remember(key._sealed, (self.names, self._get(opened), subject),  # noqa: SLF001
                         self._get(obj))
            except TypeError:  # an unhashable value besides
                pass
        return opened

