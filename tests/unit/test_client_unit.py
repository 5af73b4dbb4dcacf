"""Client pieces that need no services: JSON validation, id checks, reply routing, futures, the
``cqrs send`` argument errors and the HTTP service's 4xx answers."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import uuid
from concurrent.futures import CancelledError
from typing import Any

import attrs
import pytest

from cqrs.app import App
from cqrs.cli import main
from cqrs.client import (
    CommandDataError,
    CommandTimeoutError,
    InvalidAggregateIdError,
    InvalidCommandIdError,
    ResultFuture,
    UnknownCommandTypeError,
    command_from_json,
    resolve_command_type,
    to_jsonable,
)
from cqrs.client.command_client import check_ids
from cqrs.client.errors import ClientError
from cqrs.client.json_commands import command_fields, parse_json_object
from cqrs.client.replies import choose_reply_partition, settle
from cqrs.domain import Aggregate, CommandHandler, Event, command, event
from cqrs.testing.example import Deposit, Explode, OpenAccount
from cqrs.testing.example_app import app as bank

APP_REF = "cqrs.testing.example_app:app"


# ---- a command with every kind of field ---------------------------------------------------------


class Colour(enum.Enum):
    RED = 1
    BLUE = 2


@attrs.frozen
class Line:
    sku: str
    qty: int


@command(name="unit.client.PlaceOrder")
class PlaceOrder:
    lines: list[Line]
    at: dt.datetime
    due: dt.date
    price: decimal.Decimal
    ref: uuid.UUID
    colour: Colour
    blob: bytes
    tags: dict[str, int]
    ratio: float
    urgent: bool
    note: str | None = None


@event(name="unit.client.OrderPlaced")
class OrderPlaced:
    n: int


class Order(Aggregate, name="unit.client.Order"):
    n: int = 0

    def apply_order_placed(self, e: OrderPlaced) -> None:
        self.n = e.n


class OrderHandler(CommandHandler[Order]):
    def place(self, order: Order, cmd: PlaceOrder) -> list[Event]:
        return [OrderPlaced(len(cmd.lines))]


shop = App("unit-shop", aggregates=[Order], handlers=[OrderHandler])

GOOD: dict[str, Any] = {
    "lines": [{"sku": "a", "qty": 2}], "at": "2026-01-02T03:04:05+00:00", "due": "2026-02-01",
    "price": "12.50", "ref": "12345678-1234-5678-1234-567812345678", "colour": "BLUE",
    "blob": base64.b64encode(b"\x00\x01").decode(), "tags": {"x": 1}, "ratio": 1, "urgent": True,
}


def test_every_field_kind_is_read_from_json_and_written_back() -> None:
    order = command_from_json(shop, "PlaceOrder", GOOD)
    assert order.lines == [Line("a", 2)] and order.colour is Colour.BLUE
    assert order.at == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    assert order.price == decimal.Decimal("12.50") and order.blob == b"\x00\x01"
    assert order.ratio == 1.0 and order.note is None
    back = to_jsonable(order)
    assert command_from_json(shop, "unit.client.PlaceOrder", back) == order  # round trip
    shop.codec.decode(shop.codec.encode(order))  # and the codec takes it


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"lines": [{"sku": "a", "qty": "2"}]}, "lines[0].qty", "integer"),
    ({"lines": [{"sku": "a"}]}, "lines[0].qty", "missing"),
    ({"lines": [{"sku": "a", "qty": 1, "colour": "x"}]}, "lines[0].colour", "unknown field"),
    ({"at": "2026-01-02T03:04:05"}, "at", "UTC offset"),
    ({"at": 5}, "at", "datetime"),
    ({"due": "tomorrow"}, "due", "date"),
    ({"price": "12,5"}, "price", "decimal"),
    ({"price": 1.5}, "price", "decimal"),
    ({"ref": "nope"}, "ref", "UUID"),
    ({"colour": "GREEN"}, "colour", "'RED', 'BLUE'"),
    ({"blob": "***"}, "blob", "base64"),
    ({"tags": {"x": "1"}}, "tags.x", "integer"),
    ({"tags": [1]}, "tags", "object"),
    ({"ratio": "1.0"}, "ratio", "number"),
    ({"urgent": 1}, "urgent", "true or false"),
    ({"note": 3}, "note", "string"),
    ({"lines": "a"}, "lines", "array"),
])
def test_bad_json_names_the_field(change: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(CommandDataError) as bad:
        command_from_json(shop, "PlaceOrder", {**GOOD, **change})
    assert bad.value.field == field
    assert words in str(bad.value) and field in str(bad.value)


def test_missing_unknown_and_out_of_range_fields() -> None:
    with pytest.raises(CommandDataError, match=r"required field 'amount' \(an integer\) is missing"):
        command_from_json(bank, "Deposit", {})
    with pytest.raises(CommandDataError, match=r"unknown field\(s\) \['amout'\].*\['amount'\]"):
        command_from_json(bank, "Deposit", {"amount": 1, "amout": 1})
    with pytest.raises(CommandDataError, match="outside the Avro long range"):
        command_from_json(bank, "Deposit", {"amount": 2**70})
    assert command_from_json(bank, "Explode", "{}") == Explode()  # defaults apply


def test_malformed_json_text() -> None:
    with pytest.raises(CommandDataError, match="not valid JSON: .* line 1 column"):
        command_from_json(bank, "Deposit", '{"amount": ')
    with pytest.raises(CommandDataError, match="must be a JSON object"):
        parse_json_object("[1, 2]")


def test_command_types_by_type_name_class_name_or_class() -> None:
    assert resolve_command_type(bank, "example.bank.Deposit") is Deposit
    assert resolve_command_type(bank, "Deposit") is Deposit
    assert resolve_command_type(bank, OpenAccount) is OpenAccount
    with pytest.raises(UnknownCommandTypeError) as unknown:
        resolve_command_type(bank, "Depositt")
    assert "known command types: example.bank.CloseAccount, example.bank.Deposit" in str(unknown.value)
    with pytest.raises(UnknownCommandTypeError, match="PlaceOrder"):
        resolve_command_type(bank, PlaceOrder)
    with pytest.raises(UnknownCommandTypeError):
        resolve_command_type(bank, 42)  # type: ignore[arg-type]


def test_command_fields_describe_the_schema() -> None:
    fields = command_fields(PlaceOrder)
    assert fields["note"] == {"type": "a string | null", "required": False}
    assert fields["lines"]["type"].startswith("array of object") and fields["lines"]["required"]


@pytest.mark.parametrize(("args", "error"), [
    (("",), InvalidAggregateIdError),
    ((None,), InvalidAggregateIdError),
    (("a\0b",), InvalidAggregateIdError),
    (("\udc80",), InvalidAggregateIdError),
    (("acc", ""), InvalidCommandIdError),
    (("acc", "x\0"), InvalidCommandIdError),
    (("acc", None, 5), InvalidCommandIdError),
    (("acc", None, None, -1), InvalidCommandIdError),
    (("acc", None, None, True), InvalidCommandIdError),
    (("acc", None, None, "3"), InvalidCommandIdError),
])
def test_bad_ids_and_versions_are_refused(args: tuple[Any, ...], error: type[Exception]) -> None:
    with pytest.raises(error):
        check_ids(*args)


def test_good_ids_pass() -> None:
    check_ids("acc-1", "cmd-1", "corr-1", 0)
    check_ids("ünï-códe", None, None, None)


# ---- reply routing ------------------------------------------------------------------------------


def test_reply_partition_is_stable_and_spreads() -> None:
    assert choose_reply_partition("client-a", 8) == choose_reply_partition("client-a", 8)
    assert choose_reply_partition("client-a", 1) == 0
    spread = {choose_reply_partition(f"c-{i}", 4) for i in range(64)}
    assert spread == {0, 1, 2, 3}


def test_configured_reply_partition_wins_and_is_checked() -> None:
    assert choose_reply_partition("whatever", 4, configured=3) == 3
    with pytest.raises(ClientError, match="only 4 partitions"):
        choose_reply_partition("x", 4, configured=4)
    with pytest.raises(ClientError, match="create it first"):
        choose_reply_partition("x", 0)


def test_result_future_timeout_carries_the_command_id() -> None:
    future = ResultFuture("cmd-9", "acc-9")
    with pytest.raises(CommandTimeoutError) as timed_out:
        future.result(timeout=0.01)
    assert (timed_out.value.command_id, timed_out.value.aggregate_id) == ("cmd-9", "acc-9")
    assert isinstance(timed_out.value, TimeoutError) and "resending" in str(timed_out.value).lower()
    future.cancel()
    settle(future, result="late")  # a result after the caller gave up is ignored
    with pytest.raises(CancelledError):
        future.result()


def test_recent_commands_forget_the_oldest() -> None:
    from cqrs.http import RecentCommands

    recent = RecentCommands(capacity=2)
    futures = [ResultFuture(f"c{i}", "a") for i in range(3)]
    for f in futures:
        recent.add(f)
    assert recent.get("c0") is None and futures[0].cancelled()  # the client forgets it too
    assert recent.get("c2") is futures[2] and not futures[2].done()


# ---- CLI --------------------------------------------------------------------------------------


def test_cli_send_reports_bad_data_without_kafka(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", APP_REF, "Deposit", "acc-1", "--data", '{"amount": "ten"}']) == 2
    err = capsys.readouterr().err
    assert err.startswith("cqrs: error: field 'amount'") and "Traceback" not in err
    assert main(["send", APP_REF, "Deposit", "acc-1", "--data", "{"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main(["send", APP_REF, "Withdraww", "acc-1"]) == 2
    assert "example.bank.Withdraw" in capsys.readouterr().err
    assert main(["send", APP_REF, "Deposit", "", "--data", '{"amount": 1}']) == 2
    assert "aggregate id" in capsys.readouterr().err
    assert main(["send", APP_REF, "Deposit", "a", "--data", "@/no/such/file.json"]) == 2
    assert "cannot read --data file" in capsys.readouterr().err


def test_cli_serve_refuses_unknown_route_modules(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", APP_REF, "--routes", "no_such_module_x:routes"]) == 2
    assert "cannot import module 'no_such_module_x'" in capsys.readouterr().err


# ---- HTTP (no Kafka needed: bad requests are refused before the client starts) -----------------


@pytest.fixture
def http() -> Any:
    from fastapi.testclient import TestClient

    from cqrs.config import load_config
    from cqrs.http import HttpContext, create_http_app

    ctx = HttpContext(bank, load_config(env={}))
    with TestClient(create_http_app(ctx)) as client:
        yield client
    assert not ctx.has_client()


def test_http_rejects_bad_requests_with_reasons(http: Any) -> None:
    r = http.post("/commands/Deposit", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["message"]
    r = http.post("/commands/Deposit", json={"aggregate_id": "a", "data": {"amount": "x"}})
    assert r.status_code == 422 and r.json() == {
        "error": "CommandDataError", "field": "amount",
        "message": "field 'amount' = \"x\" is not an integer"}
    r = http.post("/commands/Nope", json={"aggregate_id": "a"})
    assert r.status_code == 404 and "known command types" in r.json()["message"]
    r = http.post("/commands/Deposit", json={"aggregate_id": "", "data": {"amount": 1}})
    assert r.status_code == 422 and "aggregate id" in r.json()["message"]
    r = http.post("/commands/Deposit", json={"aggregate_id": "a", "data": [1]})
    assert r.status_code == 422 and "body.data" in r.json()["message"]
    r = http.post("/commands/Deposit", params={"timeout": -1}, json={"aggregate_id": "a"})
    assert r.status_code == 422 and "timeout" in r.json()["message"]
    r = http.get("/aggregates/a", params={"type": "no.Such"})
    assert r.status_code == 404 and "example.bank.Account" in r.json()["message"]
    assert http.get("/commands/unknown-id/result").status_code == 404


def test_http_lists_commands_and_serves_openapi(http: Any) -> None:
    listed = http.get("/commands").json()
    assert set(listed) == set(bank.model.commands)
    assert listed["example.bank.OpenAccount"]["fields"]["owner"]["type"] == "a string"
    paths = http.get("/openapi.json").json()["paths"]
    assert {"/commands/{command_type}", "/aggregates/{aggregate_id}", "/health"} <= set(paths)


def test_http_extra_routes_plug_in() -> None:
    from fastapi import APIRouter
    from fastapi.testclient import TestClient

    from cqrs.config import load_config
    from cqrs.http import HttpContext, create_http_app

    def views(ctx: HttpContext) -> APIRouter:
        router = APIRouter(prefix="/views")

        @router.get("/{name}")
        def view(name: str) -> dict[str, str]:
            return {"app": ctx.app.name, "view": name}

        return router

    with TestClient(create_http_app(HttpContext(bank, load_config(env={})), [views])) as client:
        assert client.get("/views/balances").json() == {"app": "example-bank", "view": "balances"}


def test_http_bug_is_a_500_without_traceback() -> None:
    from fastapi import APIRouter
    from fastapi.testclient import TestClient

    from cqrs.config import load_config
    from cqrs.http import HttpContext, create_http_app

    def broken(ctx: HttpContext) -> APIRouter:
        router = APIRouter()

        @router.get("/boom")
        def boom() -> None:
            raise RuntimeError("kaput")

        return router

    api = create_http_app(HttpContext(bank, load_config(env={})), [broken])
    with TestClient(api, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 500 and r.json() == {"error": "RuntimeError", "message": "kaput"}


# ---- what cannot be stored: refused before it is sent ------------------------------------------


def test_a_command_over_the_record_limit_is_refused_with_its_size_and_the_limit() -> None:
    from cqrs.client import CommandDeliveryError, CommandTooLargeError, encode_command
    from cqrs.config import DEFAULT_MAX_RECORD_BYTES
    from cqrs.envelope import record_size
    from cqrs.errors import RecordTooLargeError

    _, key, value, headers = encode_command(bank, "acc-1", OpenAccount("a" * 990_000))
    assert record_size(key, value, headers) <= DEFAULT_MAX_RECORD_BYTES  # near the limit: sent
    with pytest.raises(CommandTooLargeError) as err:
        encode_command(bank, "acc-1", OpenAccount("a" * DEFAULT_MAX_RECORD_BYTES), command_id="big")
    exc = err.value
    assert isinstance(exc, CommandDeliveryError) and isinstance(exc, RecordTooLargeError)
    assert (exc.command_id, exc.limit) == ("big", DEFAULT_MAX_RECORD_BYTES) and exc.size > exc.limit
    assert f"{exc.size:,}-byte Kafka record, over the limit of 998,976 bytes" in str(exc)
    with pytest.raises(CommandTooLargeError, match="over the limit of 1,000 bytes"):
        encode_command(bank, "acc-1", OpenAccount("a" * 1_000), max_record_bytes=1_000)


def test_an_aggregate_id_too_long_for_its_state_row_is_refused_with_the_longest_allowed() -> None:
    from cqrs.client import encode_command
    from cqrs.envelope import MAX_STATE_KEY_BYTES

    longest = MAX_STATE_KEY_BYTES - len("example.bank.Account")
    encode_command(bank, "k" * longest, Deposit(1))
    with pytest.raises(InvalidAggregateIdError) as err:
        encode_command(bank, "k" * (longest + 1), Deposit(1))
    assert err.value.limit == longest == 65_515
    assert "65,536-byte key of the aggregate-state row" in str(err.value)
    assert "ids of example.bank.Account may have 65,515 bytes at most" in str(err.value)
    with pytest.raises(InvalidAggregateIdError, match="is empty"):
        encode_command(bank, "", Deposit(1))


def test_cli_send_refuses_what_cannot_be_stored_without_kafka(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    data = tmp_path / "big.json"
    data.write_text('{"owner": "%s"}' % ("o" * 1_100_000))
    assert main(["send", APP_REF, "OpenAccount", "acc-1", "--data", f"@{data}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cqrs: error: command ") and err.count("\n") == 1, err[:300]
    assert "over the limit of 998,976 bytes" in err and "Traceback" not in err
    assert main(["send", APP_REF, "Deposit", "k" * 65_516, "--data", '{"amount": 1}']) == 2
    err = capsys.readouterr().err
    assert "65,536-byte key" in err and err.count("\n") == 1 and "Traceback" not in err


def test_http_status_of_a_command_too_large_is_413_and_of_a_long_id_422() -> None:
    from cqrs.client import CommandTooLargeError
    from cqrs.http.errors import error_body, status_of

    too_large = CommandTooLargeError("c1", "acc-1", "example.bank.OpenAccount", 2_000_203, 998_976)
    assert status_of(too_large) == 413
    body = error_body(too_large)
    assert (body["error"], body["size"], body["limit"], body["command_id"]) == (
        "CommandTooLargeError", 2_000_203, 998_976, "c1")
    assert "998,976" in body["message"]
    long_id = InvalidAggregateIdError("too long", 65_515)
    assert status_of(long_id) == 422 and error_body(long_id)["limit"] == 65_515
