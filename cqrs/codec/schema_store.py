"""Where every schema ever written is kept, by fingerprint, so old messages stay readable.

``SchemaStore`` is the small interface; ``InMemorySchemaStore`` serves tests and single
processes; ``cqrs.codec.kafka_schema_store.KafkaSchemaStore`` keeps them in a compacted topic.
A store is write-once per fingerprint: putting a schema whose fingerprint is known keeps the
first one (same fingerprint = same Parsing Canonical Form = same binary layout).
"""

from __future__ import annotations

import abc
import json
import threading
from collections.abc import Mapping
from typing import Any

from cqrs.codec.schema import canonical_json
from cqrs.codec.single_object import fingerprint
from cqrs.errors import UnknownSchemaError

__all__ = ["InMemorySchemaStore", "SchemaStore"]


class SchemaStore(abc.ABC):
    """Schemas by fingerprint (8 bytes, as in the single-object header)."""

    @abc.abstractmethod
    def put(self, schema: Mapping[str, Any]) -> bytes:
        """Store ``schema`` (if new) and return its fingerprint."""

    @abc.abstractmethod
    def get(self, fp: bytes) -> dict[str, Any]:
        """The schema with fingerprint ``fp``; :class:`UnknownSchemaError` if absent."""

    @abc.abstractmethod
    def all(self) -> dict[bytes, dict[str, Any]]:
        """Every stored schema by fingerprint."""

    @staticmethod
    def _unknown(fp: bytes, where: str) -> UnknownSchemaError:
        return UnknownSchemaError(
            f"no schema with fingerprint {fp.hex()} in {where}: the message was written by an "
            "app whose schemas were not published to this store (check the schemas topic name "
            "and that the producer uses the same store)"
        )


class InMemorySchemaStore(SchemaStore):
    """A thread-safe in-process store (tests, the test kit, single-process tools)."""

    def __init__(self, schemas: Mapping[bytes, Mapping[str, Any]] | None = None) -> None:
        self._lock = threading.Lock()
        self._schemas: dict[bytes, str] = {}
        for schema in (schemas or {}).values():
            self.put(schema)

    def put(self, schema: Mapping[str, Any]) -> bytes:
        fp = fingerprint(schema)
        with self._lock:
            self._schemas.setdefault(fp, canonical_json(schema))
        return fp

    def get(self, fp: bytes) -> dict[str, Any]:
        text = self._schemas.get(fp)
        if text is None:
            raise self._unknown(fp, "the in-memory schema store")
        return json.loads(text)  # type: ignore[no-any-return]

    def all(self) -> dict[bytes, dict[str, Any]]:
        with self._lock:
            items = list(self._schemas.items())
        return {fp: json.loads(text) for fp, text in items}
