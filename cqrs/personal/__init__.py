"""Personal data protected by crypto-shredding: each data subject's fields are encrypted with the
subject's own key, and forgetting the subject deletes the key.

Declaring lives in the domain (``from cqrs.domain import personal``, ``@event(subject=...)``);
this package holds the cipher (:mod:`cqrs.personal.cipher`), the key stores
(:class:`KeyStore`, :class:`MemoryKeyStore`, :class:`KeyCache`,
:class:`~cqrs.personal.cassandra_keys.CassandraKeyStore`) and what the codec calls to seal and
open a message's fields (:class:`~cqrs.personal.fields.FieldSealer`); the stack's key store and
forgetting a subject (:func:`key_store_for`, :func:`forget_subject`, :func:`forget`). See
docs/personal-data.md.
"""

from __future__ import annotations

from cqrs.personal.cassandra_keys import (
    KEY_TABLE,
    CassandraKeyStore,
    open_key_store,
)
from cqrs.personal.cipher import SEALED_PREFIX, MasterKey, SubjectKey
from cqrs.personal.keys import KeyCache, KeyStore, MemoryKeyStore
from cqrs.personal.forgetting import ForgetOutcome
from cqrs.personal.stack import forget, forget_subject, key_store_for

__all__ = [
    "KEY_TABLE",
    "SEALED_PREFIX",
    "CassandraKeyStore",
    "ForgetOutcome",
    "KeyCache",
    "KeyStore",
    "MasterKey",
    "MemoryKeyStore",
    "SubjectKey",
    "forget",
    "forget_subject",
    "key_store_for",
    "open_key_store",
]
