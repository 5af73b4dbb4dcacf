"""The one error root of the framework and the errors every layer shares.

Every exception the framework raises on purpose derives from :class:`CqrsError` and also from
the builtin it resembles (``ValueError``, ``LookupError``, ...), so callers can catch either.
Messages name the offending value and say what to do about it.
"""

from __future__ import annotations

__all__ = [
    "DecisionTimeoutError",
    "CqrsError",
    "KafkaUnavailableError",
    "RecordTooLargeError",
    "TopicNotFoundError",
    "ConfigError",
    "DevStackError",
    "ServiceNotReady",
    # domain model
    "DomainModelError",
    "NotAMessageError",
    "InvalidTypeNameError",
    "DuplicateTypeNameError",
    "DuplicateHandlerError",
    "MissingHandlerError",
    "HandlerSignatureError",
    "MissingApplierError",
    "AggregateDefinitionError",
    "ReplayError",
    "Rejected",
    "InvalidAppNameError",
    "PersonalDataDeclarationError",
    # codec
    "CodecError",
    "SchemaDerivationError",
    "EncodeError",
    "NaiveDatetimeError",
    "DecodeError",
    "TruncatedMessageError",
    "BadMagicError",
    "UnknownSchemaError",
    "UnregisteredTypeError",
    "MissingUpcasterError",
    "IncompatibleSchemaError",
    "SchemaStoreError",
    "MissingKeyStoreError",
    "TamperedDataError",
    "KeyStoreError",
    "NoPersonalDataError",
    "InvalidSubjectError",
    "MissingMasterKeyError",
    # envelope
    "EnvelopeError",
    "MissingHeaderError",
    "MalformedHeaderError",
]


class CqrsError(Exception):
    """Root of every error raised by the framework."""


class ConfigError(CqrsError, ValueError):
    """A setting is missing, malformed or contradicts another one."""


class DevStackError(CqrsError, RuntimeError):
    """The local Kafka / Cassandra stack could not be installed, started or stopped."""


class ServiceNotReady(DevStackError):
    """A service was started but did not become healthy in time (the message names its log)."""


# --- domain model -------------------------------------------------------------------------


class DomainModelError(CqrsError, ValueError):
    """Commands, events, aggregates and handlers do not fit together (found at model build)."""


class NotAMessageError(CqrsError, TypeError):
    """A class or object was expected to be a ``@command`` / ``@event`` / aggregate and is not."""


class InvalidTypeNameError(CqrsError, ValueError):
    """A stable type name or class version is malformed."""


class DuplicateTypeNameError(DomainModelError):
    """Two different classes claim the same stable type name."""


class DuplicateHandlerError(DomainModelError):
    """A command type is handled by two handler methods."""


class MissingHandlerError(DomainModelError, LookupError):
    """A command type has no handler method in the model."""


class HandlerSignatureError(DomainModelError, TypeError):
    """A handler method's signature or type hints cannot be understood."""


class MissingApplierError(CqrsError, LookupError):
    """An event was applied to an aggregate that has no applier for its type."""


class AggregateDefinitionError(DomainModelError, TypeError):
    """An aggregate class cannot be used as declared (e.g. a field without a default)."""


class ReplayError(CqrsError, ValueError):
    """A stream of events cannot be folded (e.g. an event after the terminal event)."""


class Rejected(CqrsError):
    """Raised by a command handler to refuse a command for a business reason.

    Not a bug: the command gets a *rejected* result carrying ``reason`` and ``code``.
    """

    def __init__(self, reason: str, code: str = "rejected") -> None:
        if not isinstance(reason, str) or not reason:
            raise TypeError(f"Rejected reason must be a non-empty str, got {reason!r}")
        if not isinstance(code, str) or not code:
            raise TypeError(f"Rejected code must be a non-empty str, got {code!r}")
        super().__init__(reason)
        self.reason = reason
        self.code = code

    def __repr__(self) -> str:
        return f"Rejected({self.reason!r}, code={self.code!r})"


class InvalidAppNameError(CqrsError, ValueError):
    """An application name is not made of ``[a-z0-9_.-]``."""


class PersonalDataDeclarationError(DomainModelError):
    """Personal data is declared in a way the framework cannot protect (a ``personal()`` field
    without a data subject, a subject that is not a ``str`` field, an unsupported field type)."""


# --- codec ----------------------------------------------------------------------------------


class CodecError(CqrsError, ValueError):
    """Root of the serialization errors."""


class SchemaDerivationError(CodecError, TypeError):
    """No Avro schema can be derived for a class or a type hint."""


class EncodeError(CodecError, TypeError):
    """A value does not fit the type declared for its field."""


class NaiveDatetimeError(EncodeError):
    """A datetime without a timezone was given where an absolute instant is needed."""


class DecodeError(CodecError):
    """Bytes cannot be decoded into a message."""


class TruncatedMessageError(DecodeError):
    """The bytes end before the header or the body is complete."""


class BadMagicError(DecodeError):
    """The bytes do not start with the Avro single-object marker ``C3 01``."""


class UnknownSchemaError(CodecError, LookupError):
    """No schema with this fingerprint is in the schema store."""


class UnregisteredTypeError(CodecError, LookupError):
    """A class or type name is not registered with the codec."""


class MissingUpcasterError(CodecError, LookupError):
    """Stored data has an older version and no upcaster leads to the current one."""


class IncompatibleSchemaError(CodecError):
    """The current schema of a type cannot read data written with a stored schema."""


class SchemaStoreError(CqrsError, RuntimeError):
    """The schema store cannot be read or written (e.g. Kafka is unreachable)."""


class MissingKeyStoreError(CodecError):
    """A message with personal fields was encoded or decoded by a codec that has no key store
    (see ``App.use_key_store``)."""


class TamperedDataError(DecodeError):
    """An encrypted personal field does not authenticate with its subject's key: the bytes were
    changed, or the text was copied from another field, message type or subject."""


class KeyStoreError(CqrsError, RuntimeError):
    """The store of the data subjects' keys cannot be read or written."""


class NoPersonalDataError(CqrsError, LookupError):
    """A data subject was to be forgotten in an app that declares no ``personal()`` fields (it
    keeps no subjects' keys)."""


class InvalidSubjectError(CqrsError, ValueError):
    """A data subject's id that cannot be one (empty, not text)."""


class MissingMasterKeyError(ConfigError):
    """An app with ``personal()`` fields runs without a valid ``[personal_data] master_key``:
    the service cannot seal or open their values (HTTP 503, unlike a bad request's 400)."""


# --- envelope -------------------------------------------------------------------------------


class EnvelopeError(CqrsError, ValueError):
    """A Kafka record does not carry a valid message envelope."""


class MissingHeaderError(EnvelopeError, LookupError):
    """A required envelope header (or the record key) is absent."""


class MalformedHeaderError(EnvelopeError):
    """An envelope header is present but cannot be parsed."""


# ---- Kafka ------------------------------------------------------------------------------------


class TopicNotFoundError(CqrsError, LookupError):
    """A topic the framework needs does not exist on the configured cluster."""


class KafkaUnavailableError(CqrsError, RuntimeError):
    """Kafka did not answer (not running, wrong bootstrap servers, network)."""


class RecordTooLargeError(CqrsError, ValueError):
    """A record is over the largest Kafka record the framework writes
    (:meth:`cqrs.config.KafkaSettings.max_record_bytes`). The processor answers a command whose
    events or result would be such a record with a ``failed`` result of this error type."""


class DecisionTimeoutError(CqrsError, TimeoutError):
    """A decision (a command's handler and the appliers of its events) ran past the processor's
    time budget (``[processor] decision_budget_s``): its command is answered ``failed`` with
    this error type and dead-lettered, and the aggregate's later commands go on from the state
    before it. The thread that ran it is abandoned (its outcome is never written) and asked to
    stop; a handler blocked in a call that ignores that (a C extension's wait) runs on, and
    whatever it does outside the framework (an external call) happens anyway."""
