"""The domain layer imports only the standard library and attrs."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("pyspark", "confluent_kafka", "cassandra", "fastavro", "pandas", "pyarrow",
             "cryptography")  # personal data is declared in the domain, encrypted by cqrs.personal


def _loaded_after(import_stmt: str) -> list[str]:
    code = (
        f"import sys, json\n{import_stmt}\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)


def test_domain_imports_no_infrastructure() -> None:
    loaded = _loaded_after("import cqrs.domain, cqrs.domain.decision")
    assert [m for m in FORBIDDEN if m in loaded] == []


def test_top_level_package_imports_no_spark_or_kafka() -> None:
    loaded = _loaded_after("import cqrs; cqrs.command; cqrs.Aggregate")
    assert [m for m in ("pyspark", "confluent_kafka", "cassandra") if m in loaded] == []
