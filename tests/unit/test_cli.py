"""The command line parses without side effects and reports errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cqrs.cli import main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command in ("dev", "smoke", "config"):
        assert command in out


def test_importing_the_cli_parses_nothing() -> None:
    code = "import sys; sys.argv = ['x', '--bogus']; import cqrs.cli; print('imported')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "imported"


def test_config_error_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "cqrs.toml"
    bad.write_text("[kafka]\ndefault_partitions = 'many'\n")
    assert main(["--config", str(bad), "config", "show"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cqrs: error: kafka.default_partitions = 'many'")
    assert "Traceback" not in err


def test_config_show_hides_passwords(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    file = tmp_path / "cqrs.toml"
    file.write_text("[cassandra]\nusername = 'app'\npassword = 's3cret'\n")
    assert main(["--config", str(file), "config", "show"]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and '"password": "***"' in out


def test_dlq_retry_needs_positions_or_all(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "retry", "cqrs.testing.example_app:app"]) == 2
    assert "PARTITION:OFFSET" in capsys.readouterr().err


def test_tables_align_columns_and_cut_long_cells() -> None:
    from cqrs.cli.tables import render_table

    text = render_table(["name", "n"], [("a", 1), ("b" * 10, 22)], max_width=5, right=["n"])
    assert text.splitlines() == ["name    n", "-----  --", "a       1", "bbbb…  22"]


def test_cli_reference_is_current() -> None:
    from cqrs.cli.reference import cli_reference

    current = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")
    assert current == cli_reference(), "regenerate: python -m cqrs.cli.reference > docs/cli.md"
