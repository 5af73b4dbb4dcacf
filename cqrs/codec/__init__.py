"""Avro serialization: schemas from attrs classes, single-object encoding, schema evolution.

May import fastavro; ``confluent_kafka`` only in :mod:`cqrs.codec.kafka_schema_store`.
"""

from __future__ import annotations

from cqrs.codec.registry import Codec, RegisteredType, check_compatibility
from cqrs.codec.schema import avro_fullname, canonical_json, schema_for
from cqrs.codec.schema_store import InMemorySchemaStore, SchemaStore
from cqrs.codec.single_object import MAGIC, fingerprint, split
from cqrs.codec.upcasting import Upcaster, upcaster
from cqrs.errors import (  # the codec's errors, defined with every other in cqrs.errors
    BadMagicError, CodecError, DecodeError, EncodeError, IncompatibleSchemaError,
    MissingUpcasterError, NaiveDatetimeError, SchemaDerivationError, SchemaStoreError,
    TruncatedMessageError, UnknownSchemaError, UnregisteredTypeError,
)

__all__ = [
    "MAGIC",
    "BadMagicError",
    "Codec",
    "CodecError",
    "DecodeError",
    "EncodeError",
    "IncompatibleSchemaError",
    "InMemorySchemaStore",
    "MissingUpcasterError",
    "NaiveDatetimeError",
    "RegisteredType",
    "SchemaDerivationError",
    "SchemaStore",
    "SchemaStoreError",
    "TruncatedMessageError",
    "UnknownSchemaError",
    "UnregisteredTypeError",
    "Upcaster",
    "avro_fullname",
    "canonical_json",
    "check_compatibility",
    "fingerprint",
    "schema_for",
    "split",
    "upcaster",
]
