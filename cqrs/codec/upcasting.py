"""Upcasters: small pure functions turning an old stored shape into the next one.

Registered by (type name, from version); chained v1 -> v2 -> v3 until the current version of
the class. The function receives the record as decoded with its *writer* schema (a dict of
field name -> value: str, int, float, bool, bytes, datetime, date, UUID, enum symbols as str,
Decimals as str, nested records as dicts) and returns the dict of the next version. An upcaster
may also rename the type (``to_type_name``) so that old events of a moved or renamed class
land on the new one.

>>> @upcaster("bank.Deposited", from_version=1)
... def cents(data):
...     return {**data, "amount_cents": data.pop("amount") * 100}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from cqrs.errors import InvalidTypeNameError

__all__ = ["Upcaster", "UpcastFn", "upcaster"]

UpcastFn = Callable[[dict[str, Any]], dict[str, Any]]


@attrs.frozen(slots=True)
class Upcaster:
    """Turns (type_name, from_version) data into (to_type_name, to_version) data."""

    type_name: str
    from_version: int
    fn: UpcastFn
    to_type_name: str | None = None  # None: same type
    to_version: int | None = None  # None: from_version + 1

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.type_name, str) or not self.type_name:
            raise InvalidTypeNameError(
                f"upcaster type name must be a non-empty str, got {self.type_name!r}"
            )
        if isinstance(self.from_version, bool) or not isinstance(self.from_version, int) or self.from_version < 1:
            raise InvalidTypeNameError(
                f"upcaster from_version must be an int >= 1, got {self.from_version!r}"
            )
        if self.target == self.source:
            raise InvalidTypeNameError(
                f"upcaster for {self.type_name} v{self.from_version} leads to itself: raise "
                "to_version or change to_type_name"
            )

    @property
    def source(self) -> tuple[str, int]:
        return (self.type_name, self.from_version)

    @property
    def target(self) -> tuple[str, int]:
        return (
            self.to_type_name or self.type_name,
            self.to_version if self.to_version is not None else self.from_version + 1,
        )

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        return self.fn(data)


def upcaster(
    type_name: str,
    from_version: int,
    *,
    to_type_name: str | None = None,
    to_version: int | None = None,
) -> Callable[[UpcastFn], Upcaster]:
    """Decorator making a function an :class:`Upcaster` (pass it to ``App(upcasters=[...])``)."""

    def make(fn: UpcastFn) -> Upcaster:
        return Upcaster(type_name, from_version, fn, to_type_name, to_version)

    return make
