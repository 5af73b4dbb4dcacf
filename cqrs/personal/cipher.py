"""The cryptography of personal data: a subject's data key, a sealed field, key wrapping.

A personal ``str`` field is written as the text

    cqrs-pd2:<key id, 16 hex digits>:<base64url, unpadded, of nonce (12 bytes) + ciphertext + tag (16)>

AES-256-GCM with a synthetic 96-bit nonce: the first 12 bytes of HMAC-SHA256, under a key
derived from the data key, of the associated data and the text (the SIV construction). Sealing
the same value again gives the same bytes, so a batch the processor runs again after a crash
writes byte-identical records, as it does for everything else; the price is that equal values
of one field of one subject have equal ciphertexts (they are the same person's same value),
while two different values get the same nonce with probability 2^-96. The associated data binds
the ciphertext to the key id, the data subject and the field name, so a sealed text copied into
another field or another person's message does not open (:class:`TamperedDataError`).

The message type is not bound (format 2): a person's name is sealed once and the same text is
written in every event, state and view that carries it under the same field name, so a
command that copies it into one more message costs a dict look-up, not an encryption (see
:func:`seal_text`). Format 1 (``cqrs-pd1:``, written by releases before 2026-11-26) also bound
the message type; such values still open (:func:`open_text` takes the type they were written
under).

A data key is stored *wrapped* by the master key (AES-256-GCM as well, the subject and key id
as associated data: a wrapped key moved to another subject's row does not unwrap).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cqrs.errors import KeyStoreError, TamperedDataError

__all__ = ["KEY_ID_BYTES", "SEALED_PREFIX", "SEALED_PREFIXES", "MasterKey", "OpenedText", "Sealed",
           "SubjectKey", "open_sealed", "open_text", "parse_sealed", "seal_text", "sealed_as"]

SEALED_PREFIX = "cqrs-pd2:"
"""How every sealed field value written now starts (format version 2)."""

SEALED_PREFIXES = ("cqrs-pd2:", "cqrs-pd1:")
"""The prefixes of every format that still opens (2, and 1, which also bound the type)."""

KEY_ID_BYTES = 8
_KEY_BYTES = 32
_NONCE_BYTES = 12
_TAG_BYTES = 16
_FIELD_AAD_V1 = b"cqrs-pd1\0"
_FIELD_AAD = b"cqrs-pd2\0"
_WRAP_AAD = b"cqrs-key1\0"
_WRAP_VERSION = b"\x01"
_NONCE_LABEL = b"cqrs-pd1 synthetic nonce"


class SubjectKey:
    """One data subject's data key: a random id (written beside each ciphertext) and 32 secret
    bytes. Its repr shows the id only."""

    __slots__ = ("_last", "_nonce_key", "_sealed", "key_id", "secret")

    def __init__(self, key_id: bytes, secret: bytes) -> None:
        if len(key_id) != KEY_ID_BYTES or len(secret) != _KEY_BYTES:
            raise KeyStoreError(
                f"a data key has a {KEY_ID_BYTES}-byte id and {_KEY_BYTES} secret bytes, got "
                f"{len(key_id)} and {len(secret)}: the key store returned a damaged key"
            )
        self.key_id = bytes(key_id)
        self.secret = bytes(secret)
        self._nonce_key = hmac.digest(self.secret, _NONCE_LABEL, "sha256")
        # the last values sealed with this key: sealing is deterministic, and a person's name
        # or e-mail is sealed again with every event and state that copies it (see seal_text)
        # (and the sealed values of whole messages: FieldSealer.sealed_values)
        self._sealed: dict[tuple[Any, ...], Any] = {}
        # the last entry of _sealed a message used (names, values, subject, sealed): the event
        # a command writes and the state after it carry the same person's values, one after
        # the other (a tuple compared, not a memo's hash and look-up)
        self._last: tuple[Any, ...] | None = None

    def cipher(self) -> AESGCM:
        """The key's AES-GCM cipher, made for each use (~1 us): a cipher object holds ~2.4 KB
        of OpenSSL state, and a process keeps up to ``[personal_data] key_cache_size`` keys
        (100,000: 240 MB), while a key whose values are remembered (its memo) seals and opens
        nothing."""
        return AESGCM(self.secret)

    @classmethod
    def new(cls) -> SubjectKey:
        """A fresh random key."""
        return cls(os.urandom(KEY_ID_BYTES), AESGCM.generate_key(bit_length=256))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SubjectKey) and other.key_id == self.key_id
                and other.secret == self.secret)

    def __hash__(self) -> int:
        return hash(self.key_id)

    def __repr__(self) -> str:
        return f"SubjectKey(key_id={self.key_id.hex()!r})"


class Sealed:
    """A sealed field value, parsed: the id of the key it needs, the nonce + ciphertext, and
    the format it was written in (1 or 2)."""

    __slots__ = ("blob", "key_id", "version")

    def __init__(self, key_id: bytes, blob: bytes, version: int = 2) -> None:
        self.key_id = key_id
        self.blob = blob
        self.version = version


class OpenedText(str):
    """A personal value as it was opened: a ``str`` equal to the plain value, that remembers
    the sealed text it came from and the data subject and field name that text is bound to.

    Written again for the same subject under the same field name (the event a handler makes
    from a state's value, the state written back after a command), it is that sealed text as
    it is: no key is looked up and nothing is encrypted (sealing is deterministic: it is the
    text sealing the value again would give). And a value of a subject forgotten since it was
    opened is written as its old text, which no longer opens: it is never sealed again under
    a new key. Anywhere else (another subject, another field) it is a plain ``str`` and is
    sealed as one."""

    # a str subclass cannot have __slots__: the three attributes live in its __dict__
    sealed: str
    subject: str
    field: str

    def __new__(cls, plain: str, sealed: str, subject: str, field: str) -> OpenedText:
        self = super().__new__(cls, plain)
        self.sealed, self.subject, self.field = sealed, subject, field
        return self

    def __getnewargs__(self) -> tuple[str, str, str, str]:  # type: ignore[override]
        return str(self), self.sealed, self.subject, self.field


def sealed_as(value: Any, subject: Any, field: str) -> str | None:
    """The sealed text ``value`` is written as for ``subject``'s ``field`` when it is an
    :class:`OpenedText` opened there (see its doc), else None: seal it as any other ``str``."""
    if type(value) is OpenedText and value.field == field and value.subject == subject:
        return value.sealed
    return None


def _aad(key_id: bytes, subject: str, field: str) -> bytes:
    # a field name is an identifier (no NUL) and the key id has a fixed length: the subject
    # goes last, so any subject text is unambiguous
    return b"".join((_FIELD_AAD, field.encode(), b"\0", key_id, subject.encode()))


def _aad_v1(key_id: bytes, subject: str, type_name: str, field: str) -> bytes:
    """Format 1's associated data, which bound the message type as well (opened, not written)."""
    return b"".join((_FIELD_AAD_V1, type_name.encode(), b"\0", field.encode(), b"\0", key_id,
                     subject.encode()))


SEALED_PER_KEY = 8
"""Sealed values each :class:`SubjectKey` remembers (a subject's few personal values, sealed
again with every message that copies them, cost a dict look-up instead of an HMAC and an
AES-GCM encryption). They go with the key object: when a key cache drops it, or the subject is
forgotten."""


def seal_text(key: SubjectKey, text: str, subject: str, field: str) -> str:
    """``text`` encrypted with ``key``, as the self-describing text written in its place.
    Deterministic (a synthetic nonce): the same arguments give the same text, so the key keeps
    its last :data:`SEALED_PER_KEY` results and answers those again without encrypting (the
    message type is not bound: every message that copies a person's value under the same field
    name gets the same text)."""
    memo = key._sealed  # noqa: SLF001 - the key's own
    wanted = (text, field, subject)
    found = memo.get(wanted)
    if found is not None:
        return found  # type: ignore[no-any-return]
    sealed = _seal(key, text.encode(), _aad(key.key_id, subject, field), SEALED_PREFIX)
    remember(memo, wanted, sealed)
    return sealed


def _seal(key: SubjectKey, plain: bytes, aad: bytes, prefix: str) -> str:
    nonce = hmac.digest(key._nonce_key, aad + b"\0" + plain,  # noqa: SLF001
                        "sha256")[:_NONCE_BYTES]
    blob = nonce + key.cipher().encrypt(nonce, plain, aad)
    return f"{prefix}{key.key_id.hex()}:{base64.urlsafe_b64encode(blob).rstrip(b'=').decode()}"


def remember(memo: dict[Any, Any], wanted: Any, sealed: Any) -> None:
    """Keep ``sealed`` in a key's memo (at most :data:`SEALED_PER_KEY`, the oldest out)."""
    if len(memo) >= SEALED_PER_KEY:
        with contextlib.suppress(KeyError, RuntimeError, StopIteration):  # another thread's
            del memo[next(iter(memo))]
    memo[wanted] = sealed


def parse_sealed(value: str, where: str) -> Sealed | None:
    """The parts of a sealed value (either format); None for a value that is not sealed (plain
    text written before the field was declared personal). ``where`` names the field in errors."""
    if value.startswith(SEALED_PREFIX):
        version = 2
    elif value.startswith(SEALED_PREFIXES):
        version = 1
    else:
        return None
    head, sep, body = value[len(SEALED_PREFIX):].partition(":")  # the prefixes' length is one
    try:
        if not sep or len(head) != 2 * KEY_ID_BYTES:
            raise ValueError(value)
        key_id = bytes.fromhex(head)
        blob = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, binascii.Error):
        raise TamperedDataError(
            f"{where} starts like an encrypted personal value "
            f"({value[:len(SEALED_PREFIX)]!r}) but is malformed ({value[:60]!r}...): the "
            "message was changed after it was written"
        ) from None
    if len(blob) < _NONCE_BYTES + _TAG_BYTES:
        raise TamperedDataError(
            f"{where}: the encrypted personal value is {len(blob)} bytes, shorter than a nonce "
            "and a tag: the message was changed after it was written"
        )
    return Sealed(key_id, blob, version)


def open_text(key: SubjectKey, sealed: Sealed, subject: str, type_name: str, field: str) -> str:
    """The text ``sealed`` holds (``key`` must be the key with its id), or
    :class:`TamperedDataError` when it does not authenticate. ``type_name``: the message type it
    was written under (bound by format 1 only)."""
    aad = (_aad(key.key_id, subject, field) if sealed.version == 2
           else _aad_v1(key.key_id, subject, type_name, field))
    try:
        plain = key.cipher().decrypt(
            sealed.blob[:_NONCE_BYTES], sealed.blob[_NONCE_BYTES:], aad)
    except InvalidTag:
        raise TamperedDataError(
            f"the encrypted value of {type_name}.{field} (data subject {subject!r}) does not "
            "authenticate with the subject's key: it was changed after it was written, or "
            "copied from another field or subject"
        ) from None
    return plain.decode()


def open_sealed(key: SubjectKey, sealed: Sealed, text: str, subject: str, type_name: str,
                field: str) -> str:
    """:func:`open_text` of the sealed ``text`` (``sealed``, parsed). A format-2 value (bound to
    subject and field only) opens as an :class:`OpenedText` (written again as ``text`` for this
    subject and field), and is remembered by the key both ways: opening it again costs a dict
    look-up, and so does sealing the plain value again, which gives ``text`` (sealing is
    deterministic): a state read from its row and written back after a command, and the events
    that copy its values, encrypt nothing."""
    if sealed.version != 2:
        return open_text(key, sealed, subject, type_name, field)
    memo = key._sealed  # noqa: SLF001 - the key's own
    opened = memo.get(text)
    if type(opened) is not OpenedText or opened.field != field or opened.subject != subject:
        opened = OpenedText(open_text(key, sealed, subject, type_name, field), text, subject,
                            field)
        remember(memo, text, opened)
        remember(memo, (opened, field, subject), text)  # seal_text's own entry
    return opened


class MasterKey:
    """The key that wraps data keys in a key store (``[personal_data] master_key``)."""

    __slots__ = ("_aead",)

    def __init__(self, secret: bytes) -> None:
        if len(secret) != _KEY_BYTES:
            raise KeyStoreError(f"the master key is {_KEY_BYTES} bytes, got {len(secret)}")
        self._aead = AESGCM(secret)

    def __repr__(self) -> str:
        return "MasterKey(***)"

    def wrap(self, key: SubjectKey, subject: str) -> bytes:
        """``key`` encrypted for storage: version, key id, nonce, wrapped secret and tag."""
        nonce = os.urandom(_NONCE_BYTES)
        return b"".join((_WRAP_VERSION, key.key_id, nonce, self._aead.encrypt(
            nonce, key.secret, _WRAP_AAD + key.key_id + subject.encode())))

    def unwrap(self, wrapped: bytes, subject: str) -> SubjectKey:
        """The key :meth:`wrap` wrapped for ``subject``, or :class:`KeyStoreError`."""
        id_end = 1 + KEY_ID_BYTES
        nonce_end = id_end + _NONCE_BYTES
        key_id = wrapped[1:id_end]
        try:
            if wrapped[:1] != _WRAP_VERSION:
                raise InvalidTag
            secret = self._aead.decrypt(wrapped[id_end:nonce_end], wrapped[nonce_end:],
                                        _WRAP_AAD + key_id + subject.encode())
        except InvalidTag:
            raise KeyStoreError(
                f"the stored key of data subject {subject!r} does not unwrap with the master "
                "key: is [personal_data] master_key the key the store was written with? (or "
                "the row was changed or moved from another subject)"
            ) from None
        return SubjectKey(key_id, secret)
