"""The data subjects' key store of the jobs and clients on the stack, and forgetting a subject.

Every place that builds a codec on the stack (the processor and its executors, the projectors,
the process managers, the client, the state and history readers, ``cqrs serve``...) asks
:func:`key_store_for` for the key store to give it, and ``cqrs forget`` / ``POST
/subjects/{subject}/forget`` go through :func:`forget_subject`, which asks it too: one place
reads ``[personal_data]``.

>>> codec = app.codec_for(schemas, key_store=key_store_for(cfg, app))   # doctest: +SKIP
>>> forget_subject(cfg, app, "c-erin")                                  # doctest: +SKIP
True
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cqrs.config import CqrsConfig, cache_key
from cqrs.errors import ConfigError, InvalidSubjectError, MissingMasterKeyError, NoPersonalDataError
from cqrs.personal.cassandra_keys import open_key_store
from cqrs.personal.forgetting import ForgetOutcome, ForgetStep, Report, run_forget
from cqrs.personal.keys import KeyStore

if TYPE_CHECKING:
    from cqrs.app import App

__all__ = ["check_subject_id", "close_key_stores", "describe_forget", "forget", "forget_subject",
           "keeps_personal_data", "key_store_for", "require_master_key"]

_STORES: dict[str, KeyStore] = {}
_LOCK = threading.Lock()


def key_store_for(cfg: CqrsConfig, app: App) -> KeyStore | None:
    """The key store for ``app``'s personal fields, for a codec on the stack.

    - ``None`` when the app declares no ``personal()`` field: nothing is opened (no Cassandra
      session);
    - the store the app bound itself with :meth:`~cqrs.app.App.use_key_store` (e.g. a KMS-backed
      one, bound where the app is built, so every process that loads the app uses it);
    - else the configured one (:func:`~cqrs.personal.open_key_store`: a ``KeyCache`` over the
      key table of ``[cassandra] keyspace``), opened once per process per configuration and
      shared by every codec of the process (a Spark Python worker opens it on first use, like
      its other Cassandra resources). It stays open for the life of the process: do not close
      it (:func:`close_key_stores` does, for tests).

    A missing or malformed ``[personal_data] master_key`` raises
    :class:`~cqrs.errors.MissingMasterKeyError` (a :class:`ConfigError`, naming
    the app, the setting and how to make a key) before anything connects: a job asks here
    before it starts (:func:`cqrs.processor.job.check_app_schemas`), so it fails there rather
    than in a task.
    """
    if not keeps_personal_data(app):
        return None
    if app.key_store is not None:
        return app.key_store
    key = cache_key(cfg.cassandra, cfg.personal_data)
    with _LOCK:
        store = _STORES.get(key)
        if store is None:
            require_master_key(cfg, app)
            store = _STORES[key] = open_key_store(cfg)
        return store


def keeps_personal_data(app: App) -> bool:
    """Whether ``app`` declares personal data: ``personal()`` fields on its messages or
    aggregates, or personal columns on a projection (``personal_columns``, read without
    importing the projections package)."""
    return bool(app.personal_classes) or any(
        getattr(p, "personal_columns", None) for p in getattr(app, "projections", ()))


def require_master_key(cfg: CqrsConfig, app: App) -> None:
    """Refuse (:class:`~cqrs.errors.MissingMasterKeyError`, naming the app, ``[personal_data] master_key`` /
    ``CQRS_PERSONAL_DATA_MASTER_KEY`` and how to make one) a configuration without a valid
    master key for an app with personal fields that binds no key store of its own; connects
    to nothing (``cqrs serve`` checks it as it starts)."""
    if not keeps_personal_data(app) or app.key_store is not None:
        return
    try:
        cfg.personal_data.master_key_bytes()
    except ConfigError as exc:
        raise MissingMasterKeyError(
            f"app {app.name!r} has personal fields ({_names(app)}): {exc}") from None


def close_key_stores() -> None:
    """Close the stores :func:`key_store_for` opened in this process (tests; a process that
    ends need not)."""
    with _LOCK:
        stores = list(_STORES.values())
        _STORES.clear()
    for store in stores:
        store.close()


def check_subject_id(subject: object) -> str:
    """``subject`` if it can be a data subject's id (a non-empty text), else
    :class:`InvalidSubjectError`."""
    if not isinstance(subject, str) or not subject:
        raise InvalidSubjectError(
            f"data subject {subject!r}: give the person's id as it appears in the messages' "
            "subject field (e.g. a customer id), a non-empty text")
    try:
        subject.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSubjectError(
            f"data subject {subject!r} cannot be encoded as UTF-8 (a lone surrogate?): give the "
            "id as it appears in the messages") from None
    return subject


def forget_subject(cfg: CqrsConfig, app: App, subject: str, *,
                   steps: Sequence[ForgetStep] = (), report: Report = lambda _: None) -> bool:
    """Forget the data subject ``subject`` of ``app``: record the request, delete their key
    from the app's key store (:func:`key_store_for`), so each of their personal fields, in every
    copy the log made, reads as its replacement from now on, run ``steps`` (what rewrites
    copies readable without the key: the read models' is
    :func:`projections.personal.forget_step`, which ``cqrs forget`` and the HTTP service pass),
    and mark the request done (:mod:`cqrs.personal.forgetting`: a run stopped at any point is
    finished by running it again). True when this run deleted a key; False when there was none
    (forgotten before, or never seen): forgetting again is harmless.

    Processes that cached the key (a running processor, projector, client) stop using it
    within ``[personal_data] key_cache_seconds``; this process at once.
    Raises :class:`InvalidSubjectError` for an empty id and :class:`NoPersonalDataError` for an
    app without ``personal()`` fields.
    """
    return forget(cfg, app, subject, steps=steps, report=report).deleted_now


def forget(cfg: CqrsConfig, app: App, subject: str, *, steps: Sequence[ForgetStep] = (),
           report: Report = lambda _: None) -> ForgetOutcome:
    """:func:`forget_subject`, answering what the run did (:class:`ForgetOutcome`)."""
    check_subject_id(subject)
    store = key_store_for(cfg, app)
    if store is None:
        raise NoPersonalDataError(
            f"app {app.name!r} declares no personal() fields, so it keeps no data subjects' "
            f"keys and {subject!r} has nothing to forget there: is it the right app? (see "
            "docs/personal-data.md to declare personal data)")
    return run_forget(cfg, app, subject, store, steps, report)


def describe_forget(cfg: CqrsConfig, app: App, subject: str, forgotten: bool | ForgetOutcome) -> str:
    """One line saying what :func:`forget` did (``forgotten``: its outcome, or whether a key
    was deleted)."""
    outcome = forgotten if isinstance(forgotten, ForgetOutcome) else None
    rows = (f"; {outcome.rows_rewritten} read-model row(s) rewritten"
            if outcome is not None and outcome.rows_rewritten else "")
    if outcome is not None and not outcome.deleted_now and outcome.forgotten:
        return (f"finished forgetting data subject {subject!r} of app {app.name!r}: the run that "
                f"stopped had deleted their key{rows}")
    if outcome.deleted_now if outcome is not None else forgotten:
        return (f"forgot data subject {subject!r} of app {app.name!r}: their key is deleted, "
                "their personal fields read as their replacement from now on (in processes that "
                f"cached the key, within {cfg.personal_data.key_cache_seconds:g} s){rows}")
    return (f"data subject {subject!r} of app {app.name!r} has no key: forgotten before, or "
            f"never seen; nothing else to do{rows}")


def _names(app: App) -> str:
    from cqrs.domain.messages import type_name

    names = [type_name(cls) for cls in app.personal_classes]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
