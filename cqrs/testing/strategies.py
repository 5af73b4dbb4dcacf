"""Hypothesis strategies for every message, aggregate and value class, from its type hints.

The one shared strategies module: round-trip, replay and evolution properties all draw from it.
Types follow the codec (:mod:`cqrs.codec.types`), so whatever the codec supports gets a strategy.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

from hypothesis import strategies as st

from cqrs.codec import types as t
from cqrs.codec.types import Node, fields_of, node_for

__all__ = ["for_node", "for_type", "from_message_type"]

_UTC = _dt.timezone.utc
_SMALL = 5  # max size of generated lists and maps


def from_message_type(cls: type) -> st.SearchStrategy[Any]:
    """Instances of an attrs class (command, event, aggregate, value) with every field drawn."""
    return st.builds(
        cls, **{f.init_name: st.deferred(lambda f=f: for_node(f.node)) for f in fields_of(cls)}
    )


def for_type(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a type hint the codec supports (``int``, ``list[Money]``, ``UUID | None``...)."""
    return for_node(node_for(hint, repr(hint)))


def for_node(node: Node) -> st.SearchStrategy[Any]:
    kind = node.kind
    if kind == t.STR:
        return st.text(max_size=20)
    if kind == t.INT:
        bits = 31 if node.avro_type == "int" else 63
        return st.integers(-(2**bits), 2**bits - 1)
    if kind == t.FLOAT:
        return st.floats(allow_nan=False, width=32 if node.avro_type == "float" else 64)
    if kind == t.BOOL:
        return st.booleans()
    if kind == t.BYTES:
        return st.binary(max_size=20)
    if kind == t.DATETIME:
        return st.datetimes(
            min_value=_dt.datetime(1, 1, 2), max_value=_dt.datetime(9999, 12, 30), timezones=st.just(_UTC)
        )
    if kind == t.DATE:
        return st.dates()
    if kind == t.DECIMAL:
        return st.decimals(allow_nan=False, allow_infinity=False)
    if kind == t.UUID:
        return st.uuids()
    if kind == t.ENUM:
        return st.sampled_from(list(node.cls))
    if kind == t.OPTIONAL:
        return st.none() | for_node(node.inner)  # type: ignore[arg-type]
    if kind == t.LIST:
        items = st.lists(for_node(node.inner), max_size=_SMALL)  # type: ignore[arg-type]
        return items.map(tuple) if node.cls is tuple else items
    if kind == t.MAP:
        return st.dictionaries(st.text(max_size=10), for_node(node.inner), max_size=_SMALL)  # type: ignore[arg-type]
    if kind == t.RECORD:
        return from_message_type(node.cls)
    raise AssertionError(f"unknown node kind {kind}")  # pragma: no cover
