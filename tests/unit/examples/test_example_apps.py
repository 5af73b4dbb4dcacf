"""All three example apps: importable by reference, free of infrastructure imports, codec-safe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cqrs.loading import load_app
from cqrs.testing.strategies import from_message_type

REFERENCES = ["domain_examples.bank:app", "domain_examples.orders:app", "domain_examples.loyalty:app"]
VIEWS = ["domain_examples.bank.views", "domain_examples.orders.views", "domain_examples.loyalty.views"]


@pytest.mark.parametrize("reference", REFERENCES)
def test_apps_load_by_reference(reference: str) -> None:
    app = load_app(reference)
    assert app.name == reference.split(".")[1].split(":")[0]
    views = __import__(reference.split(":")[0] + ".views", fromlist=["__all__"])
    assert sorted(p.__name__ for p in app.projections) == sorted(
        n for n in views.__all__ if not n.isupper())  # every read model of views.py is wired


def test_type_names_are_namespaced_by_app() -> None:
    for reference in REFERENCES:
        app = load_app(reference)
        names = [*app.model.commands, *app.model.events, *app.model.aggregates]
        assert all(n.startswith(f"{app.name}.") for n in names), names


def test_examples_import_no_spark_kafka_or_cassandra() -> None:
    code = (
        "import sys, json, domain_examples.bank, domain_examples.orders, domain_examples.loyalty\n"
        + "".join(f"import {v}\n" for v in VIEWS)
        + "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert [m for m in ("pyspark", "confluent_kafka", "cassandra") if m in json.loads(out)] == []


def _all_messages() -> st.SearchStrategy[object]:
    classes = [c for ref in REFERENCES for c in load_app(ref).model.message_classes()]
    return st.sampled_from(classes).flatmap(from_message_type)


@settings(max_examples=60, deadline=None)
@given(_all_messages())
def test_every_message_and_state_survives_the_codec(message: object) -> None:
    app = next(load_app(r) for r in REFERENCES if type(message) in load_app(r).model.message_classes())
    assert app.codec.decode(app.codec.encode(message)) == message
