"""App: name validation, model, codec bound to a schema store."""

from __future__ import annotations

import pytest

import cqrs
from cqrs.codec import InMemorySchemaStore
from cqrs.errors import IncompatibleSchemaError, InvalidAppNameError
from cqrs.testing.example import Account, AccountHandler, Deposited


def test_app_holds_model_projections_and_codec() -> None:
    app = cqrs.App("bank-1.eu_west", aggregates=[Account], handlers=[AccountHandler], projections=["p"])
    assert app.projections == ("p",)
    assert app.model.entry("example.bank.Account").aggregate_class is Account
    assert app.codec.decode(app.codec.encode(Account("a", True, 3))) == Account("a", True, 3)


@pytest.mark.parametrize("name", ["", "Bank", "bank app", "-bank", "bank/1"])
def test_invalid_app_names(name: str) -> None:
    with pytest.raises(InvalidAppNameError, match="invalid"):
        cqrs.App(name, aggregates=[Account], handlers=[AccountHandler])


def test_use_schema_store_checks_compatibility() -> None:
    store = InMemorySchemaStore()
    store.put({"type": "record", "name": "example.bank.Deposited_v1", "cqrs.type":
               "example.bank.Deposited", "cqrs.version": 1,
               "fields": [{"name": "amount", "type": "string"}]})  # fmt: skip
    app = cqrs.App("bank", aggregates=[Account], handlers=[AccountHandler])
    with pytest.raises(IncompatibleSchemaError, match="amount"):
        app.use_schema_store(store)
    codec = app.use_schema_store(InMemorySchemaStore())
    assert codec.decode(codec.encode(Deposited(1))) == Deposited(1)


def test_public_api_is_exported_and_lazy() -> None:
    for name in cqrs.__all__:
        assert getattr(cqrs, name) is not None
