"""Avro single-object encoding: ``C3 01`` + 8-byte fingerprint + schemaless Avro body.

The fingerprint is the CRC-64-AVRO of the schema's Parsing Canonical Form, little-endian, as
the Avro specification defines it. One topic can carry records of many types: the reader looks
the fingerprint up in the schema store to find the writer schema.
"""

from __future__ import annotations

from typing import Any, Final

from fastavro.schema import fingerprint as _fingerprint
from fastavro.schema import to_parsing_canonical_form

from cqrs.errors import BadMagicError, TruncatedMessageError

__all__ = ["HEADER_SIZE", "MAGIC", "fingerprint", "header", "split"]

MAGIC: Final = b"\xc3\x01"
HEADER_SIZE: Final = 10


def fingerprint(schema: Any) -> bytes:
    """The 8 fingerprint bytes (CRC-64-AVRO, little-endian) of a schema, as on the wire."""
    return bytes.fromhex(_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def header(fp: bytes) -> bytes:
    """The 10-byte single-object header for a fingerprint."""
    return MAGIC + fp


def split(data: bytes | bytearray | memoryview) -> tuple[bytes, memoryview]:
    """``(fingerprint, body)`` of a single-object encoded message, or a typed error."""
    view = memoryview(data)
    if len(view) < 2 or view[:2] != MAGIC:
        raise BadMagicError(
            f"message starts with {bytes(view[:2]).hex(' ') or 'nothing'}, not the Avro "
            "single-object marker c3 01: it was not written by this codec (check the topic "
            "and the producer's serializer)"
        )
    if len(view) < HEADER_SIZE:
        raise TruncatedMessageError(
            f"message is {len(view)} bytes, shorter than the 10-byte single-object header: "
            "it was truncated in transit or by the producer"
        )
    return bytes(view[2:HEADER_SIZE]), view[HEADER_SIZE:]
