"""The projection routes of ``cqrs serve`` over an SQLite store folded without Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cqrs.config import load_config
from cqrs.http import HttpContext, create_http_app
from cqrs.testing.example import AccountOpened, Deposited
from projections import LocalProjector, SqliteStore, records_for
from projections.http import routes
from projections.testing import make_bank_app


@pytest.fixture
def http(tmp_path: Path) -> Any:
    from fastapi.testclient import TestClient

    db = str(tmp_path / "views.sqlite")
    bank = make_bank_app("http-views")
    store = SqliteStore(db)
    local = LocalProjector(bank, store)
    local.apply(records_for(bank, [("acc-1", AccountOpened("ann")), ("acc-1", Deposited(70)),
                                   *[(f"acc-{n}", AccountOpened("ann")) for n in range(2, 6)]]))
    store.close()
    cfg = load_config(env={}).with_overrides(projections={"store": "sqlite", "sqlite_path": db})
    with TestClient(create_http_app(HttpContext(bank, cfg), [routes])) as client:
        yield client


def test_a_view_by_key_and_the_projections_listed(http: Any) -> None:
    assert http.get("/projections/balances/acc-1").json()["balance"] == 70
    listed = {p["name"]: p for p in http.get("/projections").json()}
    assert listed["accounts_by_owner"]["kind"] == "category" and listed["balances"]["kind"] == "view"


def test_read_your_writes_waits_for_a_version_or_answers_504(http: Any) -> None:
    assert http.get("/projections/balances/acc-1?version=2").json()["balance"] == 70
    late = http.get("/projections/balances/acc-1?version=3&timeout=0.2")
    assert late.status_code == 504 and "acc-1" in late.json()["message"]


def test_category_pages_newest_first(http: Any) -> None:
    first = http.get("/projections/accounts_by_owner/groups/ann?page_size=2").json()
    assert [i["account_id"] for i in first["items"]] == ["acc-5", "acc-4"]
    rest = http.get("/projections/accounts_by_owner/groups/ann",
                    params={"page_size": 2, "page_token": first["next_page_token"]}).json()
    assert [i["account_id"] for i in rest["items"]] == ["acc-3"]  # keep = 3
    assert rest["next_page_token"] is None


@pytest.mark.parametrize(("path", "status"), [
    ("/projections/nope/acc-1", 404),
    ("/projections/balances/acc-404", 404),
    ("/projections/balances/groups/ann", 400),
    ("/projections/accounts_by_owner/groups/ann?page_token=garbage", 400),
    ("/projections/balances/acc-1?version=0", 422),
])
def test_bad_requests_get_a_4xx_with_a_reason(http: Any, path: str, status: int) -> None:
    response = http.get(path)
    assert response.status_code == status
    assert response.json().get("message") or response.json().get("detail")


def test_a_rekeyed_projection_is_listed_as_such() -> None:
    from domain_examples.loyalty import app as loyalty
    from projections.http import describe
    from projections.model import RekeyedProjection, projections_of

    (rekeyed,) = [p for p in projections_of(loyalty).values() if isinstance(p, RekeyedProjection)]
    out = describe(rekeyed)
    assert out["kind"] == "rekeyed" and out["source_aggregate"] == "loyalty.Store"
