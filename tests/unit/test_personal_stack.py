"""Personal data on the stack (#26), without services: the one key-store helper every codec of
the jobs and clients asks (``key_store_for``), forgetting through it (``forget_subject``), and
``cqrs forget`` / ``POST /subjects/{subject}/forget`` parsing and answers. The configured store
(a ``KeyCache`` over Cassandra) is replaced by memory stores here; tests/integration/
test_personal_stack.py runs the real one."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cqrs.cli import main
from cqrs.codec import InMemorySchemaStore
from cqrs.config import CqrsConfig, load_config
from cqrs.errors import ConfigError, InvalidSubjectError, NoPersonalDataError
from cqrs.personal import KeyStore, MemoryKeyStore, stack
from cqrs.personal.stack import close_key_stores, forget_subject, key_store_for
from domain_examples.bank import app as bank
from domain_examples.ticketing import PlaceTicketOrder, TicketOrder, TicketOrderPlaced
from domain_examples.ticketing import app as ticketing

TICKETING = "domain_examples.ticketing:app"
MASTER = base64.b64encode(bytes(range(32))).decode()
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[CqrsConfig, KeyStore]]]:
    """Each store the helper opens (memory stores in place of Cassandra), in order."""
    made: list[tuple[CqrsConfig, KeyStore]] = []

    def open_memory(cfg: CqrsConfig) -> KeyStore:
        made.append((cfg, MemoryKeyStore()))
        return made[-1][1]

    monkeypatch.setattr(stack, "open_key_store", open_memory)
    close_key_stores()
    yield made
    close_key_stores()


def _cfg(master: str = MASTER, **sections: Any) -> CqrsConfig:
    return load_config(env={}).with_overrides(personal_data={"master_key": master}, **sections)


# ---- key_store_for -------------------------------------------------------------------------


def test_an_app_without_personal_fields_opens_no_key_store(opened: list[Any]) -> None:
    assert key_store_for(_cfg(master=""), bank) is None  # not even the master key is asked for
    assert opened == []


def test_one_store_per_process_per_configuration(opened: list[Any]) -> None:
    cfg = _cfg()
    first = key_store_for(cfg, ticketing)
    assert first is not None and key_store_for(cfg, ticketing) is first
    assert key_store_for(_cfg(), ticketing) is first  # an equal configuration: the same store
    other = key_store_for(_cfg(cassandra={"keyspace": "elsewhere"}), ticketing)
    assert other is not None and other is not first
    assert [c.cassandra.keyspace for c, _ in opened] == [cfg.cassandra.keyspace, "elsewhere"]
    close_key_stores()
    assert key_store_for(cfg, ticketing) is not first  # opened again after closing


@pytest.mark.parametrize(("master", "says"), [
    ("", "is not set"),
    ("not base64!", "is not base64"),
    (base64.b64encode(b"short").decode(), "is 5 bytes once decoded"),
])
def test_a_missing_or_bad_master_key_is_refused_before_anything_opens(
        opened: list[Any], master: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        key_store_for(_cfg(master=master), ticketing)
    message = str(caught.value)
    assert message.startswith("app 'ticketing' has personal fields (ticketing.PlaceTicketOrder, "
                              "ticketing.TicketOrderPlaced, ticketing.TicketOrder): ")
    assert says in message and "os.urandom(32)" in message  # what is wrong, how to make one
    if not master:
        assert "CQRS_PERSONAL_DATA_MASTER_KEY" in message
    assert opened == []


def test_a_store_the_app_binds_itself_wins(opened: list[Any]) -> None:
    from cqrs import App
    from domain_examples.ticketing import TicketOrderHandler

    own = MemoryKeyStore()
    app = App("ticketing", aggregates=[TicketOrder], handlers=[TicketOrderHandler])
    app.use_key_store(own)  # e.g. a KMS-backed store bound where the app is built
    assert key_store_for(_cfg(master=""), app) is own
    assert opened == []


# ---- the sites: each codec on the stack gets the helper's store ----------------------------


@pytest.fixture
def schemas_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kafka schema store replaced by a memory one (the sites build theirs by name)."""
    monkeypatch.setattr("cqrs.codec.kafka_schema_store.KafkaSchemaStore",
                        lambda *_, **__: InMemorySchemaStore())


def _state_codec(cfg: CqrsConfig, app: Any) -> Any:
    from cqrs.processor.state import state_codec

    return state_codec(cfg, app)[0]


def _processor_step(cfg: CqrsConfig, app: Any) -> Any:
    from cqrs.processor.workers import ProcessorOptions, step_for

    ref = TICKETING if app is ticketing else "domain_examples.bank:app"
    return step_for(cfg, ProcessorOptions(app_ref=ref)).codec


def _log_codec(cfg: CqrsConfig, app: Any) -> Any:
    from cqrs.history.frames import LogSpec, spec_codec

    ref = TICKETING if app is ticketing else "domain_examples.bank:app"
    return spec_codec(LogSpec(cfg, ref, "t-schemas"))


@pytest.mark.parametrize("codec_of", [_state_codec, _processor_step, _log_codec])
def test_the_codecs_of_the_stack_use_the_helpers_store(
        opened: list[Any], schemas_in_memory: None, codec_of: Any) -> None:
    cfg = _cfg(kafka={"topic_prefix": f"t-sites-{codec_of.__name__}-"})
    codec = codec_of(cfg, ticketing)
    assert codec.key_store is key_store_for(cfg, ticketing) is opened[0][1]
    placed = TicketOrderPlaced("c-ann", "Ann Lee", "ann@example.com", "Hamlet", 2)
    payload = codec.encode(placed)
    assert b"ann@example.com" not in payload and codec.decode(payload) == placed
    assert codec_of(cfg, bank).key_store is None


def test_every_codec_for_outside_the_app_names_its_key_store() -> None:
    """One way to a codec on the stack: ``app.codec_for(store, key_store=key_store_for(...))``
    (a site that forgets the key store fails on the first personal message)."""
    bare = []
    for path in [*ROOT.joinpath("cqrs").rglob("*.py"), *ROOT.joinpath("projections").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"\.codec_for\(", text):
            call = text[m.start():text.find(")\n", m.start()) + 1]
            if "key_store=" not in call and path.name != "app.py":
                bare.append(f"{path.relative_to(ROOT)}: {call[:60]}")
    assert bare == []


def test_a_client_encodes_with_its_own_codec() -> None:
    from cqrs.client import encode_command
    from cqrs.envelope import from_kafka

    codec = ticketing.codec_for(InMemorySchemaStore(), key_store=MemoryKeyStore())
    cmd = PlaceTicketOrder("c-ann", "Ann Lee", "ann@example.com", "Hamlet", 2)
    _, key, value, headers = encode_command(ticketing, "order-1", cmd, codec=codec)
    assert b"Ann Lee" not in value and b"c-ann" in value
    assert codec.decode(from_kafka(key, value, headers)[1]) == cmd


# ---- forget_subject ------------------------------------------------------------------------


def test_forgetting_twice_says_so_the_second_time(opened: list[Any]) -> None:
    cfg = _cfg()
    keys = key_store_for(cfg, ticketing)
    assert keys is not None
    keys.get_or_create("c-erin")
    kept = keys.get_or_create("c-ann")
    assert forget_subject(cfg, ticketing, "c-erin") is True
    assert forget_subject(cfg, ticketing, "c-erin") is False
    assert forget_subject(cfg, ticketing, "never-seen") is False
    assert keys.get("c-erin") is None and keys.get("c-ann") == kept


@pytest.mark.parametrize("subject", ["", None, "\udcff"])
def test_a_subject_that_is_no_id_is_refused(opened: list[Any], subject: Any) -> None:
    with pytest.raises(InvalidSubjectError, match="data subject"):
        forget_subject(_cfg(), ticketing, subject)
    assert opened == []


def test_an_app_without_personal_fields_has_nobody_to_forget(opened: list[Any]) -> None:
    with pytest.raises(NoPersonalDataError, match="app 'bank' declares no personal"):
        forget_subject(_cfg(), bank, "c-erin")


# ---- cqrs forget ---------------------------------------------------------------------------


@pytest.fixture
def master_in_env(monkeypatch: pytest.MonkeyPatch, opened: list[Any],
                  tmp_path: Any) -> list[Any]:
    monkeypatch.setenv("CQRS_PERSONAL_DATA_MASTER_KEY", MASTER)
    monkeypatch.delenv("CQRS_CONFIG", raising=False)
    # the read models forget rewrites: an SQLite file, not the stack's Cassandra
    monkeypatch.setenv("CQRS_PROJECTIONS_STORE", "sqlite")
    monkeypatch.setenv("CQRS_PROJECTIONS_SQLITE_PATH", str(tmp_path / "views.sqlite"))
    return opened


def test_cqrs_forget_says_each_step_and_what_it_did(
        master_in_env: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    keys = key_store_for(load_config(), ticketing)
    assert keys is not None
    keys.get_or_create("c-erin")
    assert main(["forget", TICKETING, "c-erin"]) == 0
    steps, _, summary = capsys.readouterr().out.rstrip("\n").rpartition("\n")
    assert steps.splitlines() == [
        "  recorded the request (in this process's memory: the keys are not in Cassandra)",
        "  key deleted"]  # the read model never ran: no generation to rewrite
    assert summary.startswith("forgot data subject 'c-erin' of app 'ticketing': their key is "
                              "deleted")
    assert main(["forget", TICKETING, "c-erin"]) == 0  # idempotent
    out = capsys.readouterr().out
    assert out.endswith("  no key to delete (forgotten before, or never seen)\n"
                        "data subject 'c-erin' of app 'ticketing' has no key: forgotten before, "
                        "or never seen; nothing else to do\n")


@pytest.mark.parametrize(("argv", "says"), [
    (["forget", TICKETING, ""], "cqrs: error: data subject '': give the person's id"),
    (["forget", "domain_examples.bank:app", "c-erin"],
     "cqrs: error: app 'bank' declares no personal() fields"),
    (["forget", "no_such_module_qs:app", "c-erin"], "cqrs: error: cannot import module"),
])
def test_cqrs_forget_refuses_bad_input_in_one_line_with_exit_2(
        master_in_env: list[Any], capsys: pytest.CaptureFixture[str], argv: list[str],
        says: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1, err
    assert master_in_env == []  # nothing opened


def test_cqrs_forget_without_a_master_key_says_how_to_make_one(
        opened: list[Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CQRS_PERSONAL_DATA_MASTER_KEY", raising=False)
    monkeypatch.delenv("CQRS_CONFIG", raising=False)
    assert main(["forget", TICKETING, "c-erin"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cqrs: error: app 'ticketing' has personal fields") and \
        err.count("\n") == 1
    assert "CQRS_PERSONAL_DATA_MASTER_KEY" in err and "os.urandom(32)" in err


def test_cqrs_send_without_a_master_key_stops_before_kafka(
        opened: list[Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CQRS_PERSONAL_DATA_MASTER_KEY", raising=False)
    monkeypatch.delenv("CQRS_CONFIG", raising=False)
    data = '{"customer_id": "c-ann", "customer_name": "Ann", "email": "a@example.com"}'
    assert main(["send", TICKETING, "PlaceTicketOrder", "order-1", "--data", data]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cqrs: error: app 'ticketing' has personal fields") and \
        "CQRS_PERSONAL_DATA_MASTER_KEY" in err and err.count("\n") == 1


# ---- POST /subjects/{subject}/forget -------------------------------------------------------


def _http(app: Any, cfg: CqrsConfig) -> Any:
    from fastapi.testclient import TestClient

    from cqrs.http import HttpContext, create_http_app

    return TestClient(create_http_app(HttpContext(app, cfg)))


def test_http_forget_answers_200_both_times(opened: list[Any]) -> None:
    cfg = _cfg()
    keys = key_store_for(cfg, ticketing)
    assert keys is not None
    keys.get_or_create("c/erin 1")
    with _http(ticketing, cfg) as client:
        first = client.post("/subjects/c%2Ferin%201/forget")  # any text is a subject
        again = client.post("/subjects/c%2Ferin%201/forget")
        never = client.post("/subjects/c-zoe/forget")
    assert first.status_code == again.status_code == never.status_code == 200
    assert first.json()["status"] == "forgotten" and first.json()["subject"] == "c/erin 1"
    assert first.json()["message"].startswith("forgot data subject 'c/erin 1' of app 'ticketing'")
    assert again.json() == {"app": "ticketing", "subject": "c/erin 1", "status": "unknown",
                            "rows_rewritten": 0,
                            "message": "data subject 'c/erin 1' of app 'ticketing' has no key: "
                            "forgotten before, or never seen; nothing else to do"}
    assert never.json()["status"] == "unknown"
    assert keys.get("c/erin 1") is None


def test_http_forget_refusals(opened: list[Any]) -> None:
    with _http(bank, _cfg()) as client:
        no_personal = client.post("/subjects/c-erin/forget")
    with _http(ticketing, _cfg()) as client:
        empty = client.post("/subjects//forget")
        wrong_method = client.get("/subjects/c-erin/forget")
    with _http(ticketing, _cfg(master="")) as client:
        no_master = client.post("/subjects/c-erin/forget")
    assert (no_personal.status_code, no_personal.json()["error"]) == (404, "NoPersonalDataError")
    assert (empty.status_code, empty.json()["error"]) == (422, "InvalidSubjectError")
    assert wrong_method.status_code == 405
    assert (no_master.status_code, no_master.json()["error"]) == (503, "MissingMasterKeyError")
    assert "CQRS_PERSONAL_DATA_MASTER_KEY" in no_master.json()["message"]
    assert opened == []


def test_cqrs_serve_without_a_master_key_stops_as_it_starts(
        opened: list[Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CQRS_PERSONAL_DATA_MASTER_KEY", raising=False)
    monkeypatch.delenv("CQRS_CONFIG", raising=False)
    monkeypatch.setattr("uvicorn.run", lambda *_, **__: pytest.fail("served without a key"))
    assert main(["serve", TICKETING, "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cqrs: error: app 'ticketing' has personal fields") and \
        err.count("\n") == 1
    assert opened == []  # checked without connecting


def test_a_forget_stopped_after_deleting_the_key_is_finished_by_running_it_again() -> None:
    from cqrs.personal.forgetting import run_forget
    from cqrs.personal.stack import describe_forget

    keys = MemoryKeyStore()
    keys.get_or_create("c-kim")
    calls: list[str] = []

    def crashing(cfg: Any, app: Any, subject: str, store: Any, report: Any) -> int:
        calls.append(subject)
        if len(calls) == 1:
            raise RuntimeError("killed while rewriting")
        report("rewrote 2 rows")
        return 2

    with pytest.raises(RuntimeError, match="killed"):
        run_forget(_cfg(), ticketing, "c-kim", keys, [crashing])
    assert keys.get("c-kim") is None  # the key went before the crash
    lines: list[str] = []
    outcome = run_forget(_cfg(), ticketing, "c-kim", keys, [crashing], lines.append)
    assert lines[0].startswith("resuming the forget of 'c-kim' requested at ")
    assert lines[0].endswith("(it stopped after status 'key_deleted')")
    assert lines[2:] == ["key deleted before, by the run that stopped", "rewrote 2 rows"]
    assert (outcome.deleted_now, outcome.forgotten, outcome.rows_rewritten) == (False, True, 2)
    assert describe_forget(_cfg(), ticketing, "c-kim", outcome) == (
        "finished forgetting data subject 'c-kim' of app 'ticketing': the run that stopped had "
        "deleted their key; 2 read-model row(s) rewritten")
    again = run_forget(_cfg(), ticketing, "c-kim", keys, [crashing])  # done: nothing resumed
    assert (again.resumed, again.forgotten, calls) == (None, False, ["c-kim"] * 3)
