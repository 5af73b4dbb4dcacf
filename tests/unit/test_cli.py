"""The command line parses without side effects and reports errors without tracebacks."""

from __future__ import annotations

import os
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


# the console script `cqrs` does this (pyproject's [project.scripts])
CONSOLE_SCRIPT = "import sys; from cqrs.cli import main; sys.exit(main())"


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    # `cqrs config show` needs no services; 20,000 Spark options make it print ~1.5 MB, far more
    # than a pipe holds, so it is still writing when `head -1` has gone
    config = tmp_path / "cqrs.toml"
    config.write_text("[spark.conf]\n" + "".join(
        f'"spark.cqrs.test.k{i:05d}" = "{"v" * 40}"\n' for i in range(20_000)))
    cqrs = subprocess.Popen([sys.executable, "-c", CONSOLE_SCRIPT, "--config", str(config),
                             "config", "show"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert cqrs.stdout is not None and cqrs.stderr is not None
    head = subprocess.Popen(["head", "-1"], stdin=cqrs.stdout, stdout=subprocess.PIPE)
    cqrs.stdout.close()  # only head reads it
    first_line, _ = head.communicate(timeout=120)
    err = cqrs.stderr.read().decode()
    assert cqrs.wait(timeout=120) == 141  # as for a command killed by SIGPIPE (128 + 13)
    assert first_line == b"{\n"
    assert err == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit


@pytest.mark.parametrize(("argv", "code"), [(["config", "docs"], 141), (["--help"], 0)])
def test_output_into_a_pipe_nobody_reads_is_no_traceback(argv: list[str], code: int) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the command writes anything
    try:
        done = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *argv], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (code, "")  # argparse's help ignores the error


def test_a_closed_stdout_is_told_from_an_open_one() -> None:
    # a BrokenPipeError from elsewhere (a socket) is not hidden: main() re-raises it unless
    # standard output itself lost its reader
    probe = "import sys; from cqrs.cli.main import _stdout_closed; sys.exit(3 if _stdout_closed() else 4)"
    read_end, write_end = os.pipe()
    try:
        assert subprocess.run([sys.executable, "-c", probe], stdout=write_end).returncode == 4
        os.close(read_end)
        assert subprocess.run([sys.executable, "-c", probe], stdout=write_end).returncode == 3
    finally:
        os.close(write_end)


def _cqrs_in(folder: Path, *argv: str, pythonpath_dot: bool) -> subprocess.CompletedProcess[str]:
    """``cqrs ARGV`` run in ``folder`` as the console script runs: -P keeps the current directory
    off Python's path, as it is for `.venv/bin/cqrs`; the framework's own path is kept."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p not in ("", ".")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*kept, *(["."] if pythonpath_dot else [])])}
    return subprocess.run([sys.executable, "-P", "-c", CONSOLE_SCRIPT, *argv], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_an_app_module_off_the_path_is_named_with_the_folder_and_the_way_out(tmp_path: Path) -> None:
    (tmp_path / "ticketing_qs.py").write_text("from cqrs.testing.example_app import app\n")
    # `cqrs send` loads the app and refuses an unknown command type before it needs Kafka
    lost = _cqrs_in(tmp_path, "send", "ticketing_qs:app", "NoSuchCommand", "t-1", pythonpath_dot=False)
    assert lost.returncode == 2 and "Traceback" not in lost.stderr
    assert lost.stderr.startswith("cqrs: error: cannot import module 'ticketing_qs' of "
                                  "'ticketing_qs:app': No module named 'ticketing_qs'")
    assert f"current directory ({tmp_path})" in lost.stderr
    assert "PYTHONPATH=." in lost.stderr and "pip install -e ." in lost.stderr
    # the advice works: with PYTHONPATH=. the module imports and the app answers
    found = _cqrs_in(tmp_path, "send", "ticketing_qs:app", "NoSuchCommand", "t-1", pythonpath_dot=True)
    assert found.returncode == 2
    assert "unknown command type 'NoSuchCommand' for app 'example-bank'" in found.stderr
    # on the path but misspelt: the folder is named, no PYTHONPATH advice
    typo = _cqrs_in(tmp_path, "send", "ticketing_q:app", "NoSuchCommand", "t-1", pythonpath_dot=True)
    assert f"The current directory ({tmp_path}) is on Python's path but holds no ticketing_q.py" \
        in typo.stderr and "PYTHONPATH=." not in typo.stderr


def test_a_module_that_fails_inside_keeps_its_own_error(tmp_path: Path) -> None:
    (tmp_path / "needs_more_qs.py").write_text("import not_installed_dependency_qs\n")
    done = _cqrs_in(tmp_path, "send", "needs_more_qs:app", "X", "t-1", pythonpath_dot=True)
    assert done.returncode == 2
    assert done.stderr.strip() == ("cqrs: error: cannot import module 'needs_more_qs' of "
                                   "'needs_more_qs:app': No module named "
                                   "'not_installed_dependency_qs'")
