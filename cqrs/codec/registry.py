"""``Codec``: registered classes <-> single-object encoded Avro bytes, with schema evolution.

Encoding writes ``C3 01`` + fingerprint + body with the class's current schema (published to
the schema store on first use). Decoding finds the writer schema by fingerprint, then:

* same type and version as the current class: Avro schema resolution (fastavro) from the
  writer schema to the current one (added fields with defaults, removed fields, promotions);
* older version (or a renamed type): decode with the writer schema, run the upcasters
  (type, v1) -> v2 -> v3 ..., then build the current class (missing fields take defaults).

Bodies written with a class's current schema are written and read by code generated for it
(:mod:`cqrs.codec.binary`); on anything that code does not handle (an unexpected value, corrupt
bytes), encoding and decoding go through fastavro, whose results and errors are the reference.

``check_compatibility(store, codec)`` is run when an app starts: it refuses a current schema that
cannot read what the store says was written before.

A class with ``personal()`` fields (:mod:`cqrs.domain.personal`) is encoded sealed and decoded
opened by a :class:`~cqrs.personal.fields.FieldSealer` with the codec's key store: its plans
carry the sealer, and it never gets the generated fast paths below, so the classes without
personal fields (all others) pay nothing for it.
"""

from __future__ import annotations

import functools
import io
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from cqrs.codec.binary import Reader, Writer, record_reader, record_writer
from cqrs.codec.compat import incompatibilities
from cqrs.codec.schema import schema_for
from cqrs.codec.schema_store import InMemorySchemaStore, SchemaStore
from cqrs.codec.single_object import HEADER_SIZE, MAGIC, fingerprint, header, split
from cqrs.codec.types import fields_of
from cqrs.codec.upcasting import Upcaster
from cqrs.codec.values import Decoder, Encoder, record_decoder, record_encoder, record_from_avro
from cqrs.domain.messages import type_name, type_version
from cqrs.domain.personal import personal_fields
from cqrs.errors import (
    CodecError,
    CqrsError,
    DecodeError,
    EncodeError,
    IncompatibleSchemaError,
    MissingUpcasterError,
    TruncatedMessageError,
    UnregisteredTypeError,
)

if TYPE_CHECKING:
    from cqrs.personal.fields import FieldSealer
    from cqrs.personal.keys import KeyStore

__all__ = ["Codec", "RegisteredType", "check_compatibility"]


@attrs.frozen(slots=True)
class RegisteredType:
    """A class the codec knows: its stable name, version, schema and fingerprint."""

    cls: type
    type_name: str
    version: int
    schema: dict[str, Any]
    parsed: Any
    fingerprint: bytes
    header: bytes


@attrs.frozen(slots=True)
class _Writer:
    parsed: Any
    type_name: str
    version: int


@attrs.frozen(slots=True)
class _EncodePlan:
    """What ``encode`` needs per class, found once (after the schema was published)."""

    header: bytes
    parsed: Any
    to_record: Encoder
    write: Writer | None  # header + body, generated; None: fastavro only
    sealer: FieldSealer | None  # a class with personal fields: seal them first
    # a class with personal fields: write(obj, its personal fields' values as written)
    write_sealed: Callable[..., bytes] | None = None


@attrs.frozen(slots=True)
class _DecodePlan:
    """What ``decode`` needs per writer fingerprint of a current class (no upcasting)."""

    writer: _Writer
    reader: Any  # None when the writer schema is the current one (fastavro skips resolution)
    from_record: Decoder
    read: Reader | None  # generated, when the writer schema is the current one
    sealer: FieldSealer | None  # a class with personal fields: open them after


class Codec:
    """Encodes registered classes to bytes and decodes bytes to the current classes."""

    # use the generated Avro writers and readers where they apply (False: fastavro only, the
    # reference they are compared with)
    _generated: bool = True

    def __init__(
        self,
        classes: Iterable[type] = (),
        *,
        upcasters: Iterable[Upcaster] = (),
        store: SchemaStore | None = None,
        key_store: KeyStore | None = None,
    ) -> None:
        self.store: SchemaStore = store if store is not None else InMemorySchemaStore()
        # the data subjects' keys, for classes with personal fields (None: such a class fails
        # to encode or decode, with MissingKeyStoreError)
        self.key_store = key_store
        self._sealers: dict[type, FieldSealer] = {}
        self._by_class: dict[type, RegisteredType] = {}
        self._by_name: dict[str, RegisteredType] = {}
        self._published: set[bytes] = set()
        self._writers: dict[bytes, _Writer] = {}
        # per-call lookups done once: class -> encode plan, writer fingerprint -> decode plan
        self._encode_plans: dict[type, _EncodePlan] = {}
        self._decode_plans: dict[bytes, _DecodePlan] = {}
        # the generated writer per class and reader per header (the hottest paths)
        self._writes: dict[type, Writer] = {}
        self._reads: dict[bytes, Reader] = {}
        self._lock = threading.Lock()
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        for cls in classes:
            self.register(cls)
        for up in upcasters:
            if not isinstance(up, Upcaster):
                raise TypeError(f"upcasters takes Upcaster objects (see @upcaster), got {up!r}")
            other = self._upcasters.setdefault(up.source, up)
            if other is not up:
                raise CodecError(
                    f"two upcasters from {up.type_name} v{up.from_version}: keep one"
                )

    # ---- registration ---------------------------------------------------------------------

    def register(self, cls: type) -> RegisteredType:
        """Register an attrs class (message, aggregate or value) under its stable type name."""
        found = self._by_class.get(cls)
        if found is not None:
            return found
        name = type_name(cls)
        other = self._by_name.get(name)
        if other is not None:
            raise CodecError(
                f"type name {name!r} is registered for {other.cls.__qualname__} already; "
                f"{cls.__qualname__} needs another name"
            )
        schema = schema_for(cls)
        declared = personal_fields(cls)
        fp = fingerprint(schema)
        reg = RegisteredType(
            cls, name, type_version(cls), schema, parse_schema(schema), fp, header(fp)
        )
        if declared is not None:
            from cqrs.personal.fields import FieldSealer  # cryptography: only when needed

            self._sealers[cls] = FieldSealer(declared, name, self.key_store)
        self._by_class[cls] = reg
        self._by_name[name] = reg
        # our own schemas are known without asking the store (the hot path on executors)
        self._writers.setdefault(fp, _Writer(reg.parsed, name, reg.version))
        return reg

    def registered(self) -> list[RegisteredType]:
        """Every registered class, in registration order."""
        return list(self._by_name.values())

    def lookup(self, cls_or_name: type | str) -> RegisteredType:
        """The registration of a class or type name, or :class:`UnregisteredTypeError`."""
        reg = (
            self._by_name.get(cls_or_name)
            if isinstance(cls_or_name, str)
            else self._by_class.get(cls_or_name)
        )
        if reg is None:
            shown = cls_or_name if isinstance(cls_or_name, str) else cls_or_name.__qualname__
            raise UnregisteredTypeError(
                f"type {shown!r} is not registered with this codec (registered: "
                f"{sorted(self._by_name)}): add its class to the App (aggregates, handlers, "
                "events=...) or call codec.register(cls)"
            )
        return reg

    def publish_schemas(self) -> list[bytes]:
        """Put every registered schema into the store now (done lazily on first encode too)."""
        return [self._publish(reg) for reg in self.registered()]

    def _publish(self, reg: RegisteredType) -> bytes:
        if reg.fingerprint not in self._published:
            with self._lock:
                fp = self.store.put(reg.schema)
                assert fp == reg.fingerprint, "schema store fingerprint mismatch"
                self._published.add(fp)
        return reg.fingerprint

    # ---- encode / decode ------------------------------------------------------------------

    def encode(self, obj: object) -> bytes:
        """Single-object encoded Avro bytes of a registered instance."""
        write = self._writes.get(type(obj))
        if write is not None:
            try:
                return write(obj)
            except Exception:  # noqa: BLE001, S110 - a value it does not take: the path below
                pass  # checks every value and raises the error naming the field
        plan = self._encode_plans.get(type(obj))
        if plan is None:
            plan = self._encode_plan(obj)
            if plan.write is not None and plan.sealer is None:  # the first encode of a class:
                return self.encode(obj)  # now with its writer
        if plan.sealer is not None:
            values = plan.sealer.sealed_values(obj)  # without a copy of obj
            if plan.write_sealed is not None:
                try:
                    return plan.write(obj) if values is None else plan.write_sealed(obj, values)
                except Exception:  # noqa: BLE001, S110 - as above
                    pass
            if values is not None:
                obj = plan.sealer.copy_with(obj, values)
        record = plan.to_record(obj, None)
        buf = io.BytesIO()  # one per call: the codec is shared by threads
        buf.write(plan.header)
        try:
            schemaless_writer(buf, plan.parsed, record)
        except Exception as exc:  # values were checked already: this is a codec bug or exotic
            raise EncodeError(f"cannot encode {obj!r} with Avro: {exc}") from exc
        return buf.getvalue()

    def values_writer(self, cls: type) -> Callable[[Sequence[Any]], bytes] | None:
        """``write(values)``: what :meth:`encode` returns for an instance of ``cls`` whose field
        values are ``values`` (in the schema's field order), without making the instance: for a
        hot path that would build an object only to encode it. ``None`` when ``cls`` has
        personal fields or no generated writer (encode an instance then). ``write`` raises on a
        value the writer does not take: make the instance and :meth:`encode` it, for the error
        that names the field."""
        reg = self.lookup(cls)
        if not self._generated or reg.cls in self._sealers:
            return None
        self._publish(reg)
        names = tuple(f.name for f in fields_of(reg.cls))
        write = record_writer(reg.cls, reg.schema, reg.header, names)
        return None if write is None else functools.partial(write, None)

    def _encode_plan(self, obj: object) -> _EncodePlan:
        """Look the class up, publish its schema and keep both (the first encode of a class)."""
        reg = self._by_class.get(type(obj))
        if reg is None:
            if isinstance(obj, type):
                raise EncodeError(f"encode takes an instance, got the class {obj.__qualname__}")
            reg = self.lookup(type(obj))
        self._publish(reg)
        write = record_writer(reg.cls, reg.schema, reg.header) if self._generated else None
        sealer = self._sealers.get(reg.cls)
        write_sealed = None if sealer is None or write is None else \
            record_writer(reg.cls, reg.schema, reg.header, sealer.names)
        plan = _EncodePlan(reg.header, reg.parsed, record_encoder(reg.cls), write, sealer,
                           write_sealed)
        self._encode_plans[reg.cls] = plan
        if write is not None and sealer is None:
            self._writes[reg.cls] = write
        return plan

    def writer_of(self, data: bytes | bytearray | memoryview) -> tuple[str, int]:
        """``(type name, version)`` the bytes were written with, without decoding the body."""
        if type(data) is bytes and data[:2] == MAGIC:  # a known writer: one dict look-up
            known = self._writers.get(data[2:HEADER_SIZE])
            if known is not None and len(data) >= HEADER_SIZE:
                return known.type_name, known.version
        fp, _ = split(data)
        w = self._writer(fp)
        return w.type_name, w.version

    def decode(self, data: bytes | bytearray | memoryview) -> Any:
        """The current-class instance encoded in ``data`` (upcast and resolved)."""
        if type(data) is bytes:  # the common case, without copies
            read = self._reads.get(data[:HEADER_SIZE])
            if read is not None:
                try:
                    return read(data, HEADER_SIZE)
                except Exception:  # noqa: BLE001, S110 - bytes it does not read as fastavro
                    pass  # would (e.g. truncated): fastavro's result or error below
        if type(data) is bytes and data[:2] == MAGIC:
            plan = self._decode_plans.get(data[2:HEADER_SIZE])
            if plan is not None and plan.sealer is None:
                buf = io.BytesIO(data)
                buf.seek(HEADER_SIZE)
                record = self._read(buf, len(data) - HEADER_SIZE, plan.writer, plan.reader)
                return plan.from_record(record, None)
        fp, body = split(data)
        writer = self._writer(fp)
        reg = self._by_name.get(writer.type_name)
        if reg is not None and reg.version == writer.version:
            plan = self._decode_plans.get(fp) or self._decode_plan(fp, writer, reg)
            obj = self._current(plan, body, writer)
            return obj if plan.sealer is None else plan.sealer.open(obj)
        record = self._read(io.BytesIO(body), len(body), writer, None)
        name, version = writer.type_name, writer.version
        chain = [f"{name} v{version}"]
        opened = self._open_before_upcasting(record, name, version)
        if opened is not None:
            record = opened
        while (up := self._upcasters.get((name, version))) is not None:
            try:
                record = up(record)
            except Exception as exc:
                raise DecodeError(
                    f"upcaster {up.fn.__qualname__} from {name} v{version} failed: {exc}"
                ) from exc
            name, version = up.target
            chain.append(f"{name} v{version}")
        reg = self._by_name.get(name)
        if reg is None:
            raise UnregisteredTypeError(
                f"stored type {' -> '.join(chain)} is not registered with this codec: register "
                "its class, or an upcaster that renames it to a registered type"
            )
        if reg.version != version:
            remedy = (
                f"register an upcaster from {name} v{version}"
                if version < reg.version
                else "this data was written by newer code: deploy the newer version"
            )
            raise MissingUpcasterError(
                f"stored data reached {' -> '.join(chain)} but the current class "
                f"{reg.cls.__qualname__} is v{reg.version}: {remedy}"
            )
        obj = record_from_avro(reg.cls, record)
        sealer = self._sealers.get(reg.cls)
        if sealer is None or opened is not None:
            return obj
        return sealer.open(obj, writer.type_name)

    def _open_before_upcasting(self, record: Any, name: str, version: int) -> Any:
        """``record`` (written as ``name`` v``version``) with its personal values opened, when
        upcasters will run on it and the class they lead to has personal fields; else None."""
        if (name, version) not in self._upcasters or not self._sealers or not isinstance(
                record, dict):
            return None
        target = (name, version)
        while (up := self._upcasters.get(target)) is not None:
            target = up.target
        reg = self._by_name.get(target[0])
        sealer = None if reg is None else self._sealers.get(reg.cls)
        return None if sealer is None else sealer.open_record(record, name)

    def quick_paths(self) -> tuple[dict[bytes, Reader], dict[type, Writer]]:
        """The generated reader per single-object header and writer per class that
        :meth:`decode` and :meth:`encode` try first (the dicts themselves, filled as classes are
        first decoded and encoded): for a native caller taking the same quick path, falling
        back to those methods where a dict has no entry or its entry raises."""
        return self._reads, self._writes

    # ---- personal data: what a batch's key look-up needs ----------------------------------

    @property
    def personal(self) -> bool:
        """Whether any registered class has personal fields (else nothing below finds any)."""
        return bool(self._sealers)

    @property
    def personal_types(self) -> frozenset[str]:
        """The type names of the registered classes with personal fields."""
        return frozenset(sealer.type_name for sealer in self._sealers.values())

    def subject_of(self, obj: object) -> str | None:
        """The data subject of ``obj`` if its class has personal fields (its subject field,
        when a non-empty ``str``), else None."""
        sealer = self._sealers.get(type(obj))
        if sealer is None:
            return None
        subject = getattr(obj, sealer.subject, None)
        return subject if type(subject) is str and subject else None

    def peek_subject(self, data: bytes) -> str | None:
        """The data subject of the message in ``data`` when its class has personal fields,
        read without opening them (no key is looked up); None for any other message, and
        for one this cannot read here (data of an older version, or not a message: decoding
        it says what is wrong, and looks its key up then). Costs a header look-up for a class
        without personal fields, a decode for one with."""
        if type(data) is not bytes or data[:HEADER_SIZE] in self._reads:
            return None
        try:
            fp, body = split(data)
            writer = self._writer(fp)
            reg = self._by_name.get(writer.type_name)
            if reg is None or reg.version != writer.version or reg.cls not in self._sealers:
                return None
            plan = self._decode_plans.get(fp) or self._decode_plan(fp, writer, reg)
            return self.subject_of(self._current(plan, body, writer))
        except CqrsError:
            return None

    def subjects_in(self, payloads: Iterable[bytes]) -> set[str]:
        """The data subjects of the messages with personal fields among ``payloads``
        (:meth:`peek_subject`: nothing is opened, no key looked up)."""
        peek = self.peek_subject
        return {s for data in payloads if (s := peek(data)) is not None}

    def prefetch_keys(self, payloads: Iterable[bytes], *, create: bool = False) -> int:
        """Before decoding a batch of messages one by one: the keys of their data subjects
        from the key store at once (:meth:`~cqrs.personal.keys.KeyStore.prefetch`; ``create``:
        make the missing ones, for a batch whose subjects' messages will be encoded too), so
        the decodes find them cached. Nothing for a codec without personal classes. The
        number of subjects asked for."""
        if not self._sealers or self.key_store is None:
            return 0
        subjects = self.subjects_in(payloads)
        if subjects:
            self.key_store.prefetch(subjects, create=create)
        return len(subjects)

    def _current(self, plan: _DecodePlan, body: bytes | memoryview, writer: _Writer) -> Any:
        """The instance of a current class in ``body`` (written with ``writer``'s schema)."""
        if plan.read is not None:
            try:
                return plan.read(bytes(body), 0)
            except Exception:  # noqa: BLE001, S110 - as above
                pass
        record = self._read(io.BytesIO(body), len(body), writer, plan.reader)
        return plan.from_record(record, None)

    def _writer(self, fp: bytes) -> _Writer:
        found = self._writers.get(fp)
        if found is None:
            schema = self.store.get(fp)
            name = schema.get("cqrs.type") or schema.get("name", "?")
            version = schema.get("cqrs.version", 1)
            found = _Writer(parse_schema(schema), str(name), int(version))
            self._writers[fp] = found
        return found

    def _decode_plan(self, fp: bytes, writer: _Writer, reg: RegisteredType) -> _DecodePlan:
        """Keep what decoding data of a current class written with ``fp`` needs."""
        # fastavro drops a reader schema equal to the writer's on every call: compare once
        reader = None if writer.parsed == reg.parsed else reg.parsed
        read = record_reader(reg.cls, reg.schema) if reader is None and self._generated else None
        sealer = self._sealers.get(reg.cls)
        plan = _DecodePlan(writer, reader, record_decoder(reg.cls), read, sealer)
        self._decode_plans[fp] = plan
        if read is not None and sealer is None:
            self._reads[header(fp)] = read
        return plan

    def _read(self, buf: io.BytesIO, size: int, writer: _Writer, reader: Any) -> Any:
        """Read one record from ``buf`` (at the start of a ``size``-byte body), all of it."""
        start = buf.tell()
        try:
            record = schemaless_reader(buf, writer.parsed, reader)
        except (EOFError, IndexError) as exc:
            raise TruncatedMessageError(
                f"the body of a {writer.type_name} v{writer.version} message ends early "
                f"({size} bytes): the message was truncated"
            ) from exc
        except Exception as exc:
            raise DecodeError(
                f"cannot decode a {writer.type_name} v{writer.version} message: {exc}; if the "
                "schema changed, run check_compatibility and add a default or an upcaster"
            ) from exc
        left = size - (buf.tell() - start)
        if left:
            raise DecodeError(
                f"{left} bytes left after a {writer.type_name} "
                f"v{writer.version} message: the bytes are corrupt or not one message"
            )
        return record


def check_compatibility(store: SchemaStore, codec: Codec) -> None:
    """Refuse current schemas that cannot read stored data (:class:`IncompatibleSchemaError`).

    For every stored schema of a registered type (directly or through upcasters): same version
    -> Avro resolution must succeed; older version -> an upcaster chain must lead to the
    current version. Stored types this codec does not know are ignored (other apps).
    """
    problems: list[str] = []
    for fp, schema in store.all().items():
        name = schema.get("cqrs.type")
        version = schema.get("cqrs.version", 1)
        if not isinstance(name, str):
            continue
        start = (name, version)
        while (up := codec._upcasters.get((name, version))) is not None:  # noqa: SLF001
            name, version = up.target
        reg = codec._by_name.get(name)  # noqa: SLF001
        if reg is None:
            if start != (name, version):
                problems.append(
                    f"{start[0]} v{start[1]}: upcasters lead to {name} v{version}, which is not "
                    "registered: register that class"
                )
            continue
        if version < reg.version:
            problems.append(
                f"{name} v{version} (stored, fingerprint {fp.hex()}): no upcaster to the current "
                f"v{reg.version}: register an upcaster from {name} v{version}"
            )
        elif version == reg.version and start == (name, version):
            for p in incompatibilities(schema, reg.schema):
                problems.append(
                    f"{p} (type {name} v{version}, stored fingerprint {fp.hex()})"
                )
    if problems:
        raise IncompatibleSchemaError(
            "the current schemas cannot read stored data: add a default or register an "
            "upcaster (and raise the class version) for each of:\n  " + "\n  ".join(problems)
        )
