"""``cqrs run app`` on the real stack: the bank's processor and projector in one Spark driver,
its ``/metrics`` scraped with the Prometheus client's parser, ``cqrs serve``'s status page in a
real headless Chromium, and ``cqrs top``.

One runner and one service (subprocesses) on topics, checkpoints and a metrics port of their
own run for the whole module; the last test continues the runner's checkpoints with
``--available-now`` jobs in the test process, on the session's Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cqrs.cli.main import main
from cqrs.client import CommandClient
from cqrs.config import CqrsConfig
from domain_examples.bank import DEMO_CRASHING_OWNERS, AuditAccount, Deposit, OpenAccount, app
from ports import free_port

APP_REF = "domain_examples.bank:app"
ROOT = Path(__file__).resolve().parents[2]
# the screenshot in the docs is refreshed only when asked (CQRS_UPDATE_SCREENSHOTS=1), so a test
# run leaves the working tree as it found it
DOCS_SCREENSHOT = ROOT / "docs" / "img" / "status-page.png"
START_WAIT = 300.0  # a Spark driver and two queries on a shared 2-core box
WAIT = 120.0
T = TypeVar("T")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()  # type: ignore[no-any-return]


def _until(what: str, probe: Callable[[], T | None], timeout: float, logs: list[Path]) -> T:
    """``probe()``'s first truthy value within ``timeout`` seconds, else a failure with logs."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # a server not up yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)  # local HTTP and Kafka reads: cheap; a second a poll was ~0.4 s a wait
    tails = "\n".join(f"--- {p.name}:\n{p.read_text()[-4000:]}" for p in logs if p.exists())
    pytest.fail(f"{what}: not within {timeout:.0f} s (last: {last!r})\n{tails}")


@attrs.frozen
class Stack:
    cfg: CqrsConfig
    runner_url: str
    serve_url: str
    logs: list[Path]
    env: dict[str, str]
    runner: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def stack(cqrs_config: CqrsConfig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from cqrs.cassandra_io import cql_cluster

    token = uuid.uuid4().hex[:8]
    prefix, keyspace = f"t-runapp-{token}-", f"t_runapp_{token}"  # read models have no prefix
    folder = tmp_path_factory.mktemp("run_app")
    metrics_port, http_port = free_port(), free_port()
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     cassandra={"keyspace": keyspace},
                                     spark={"checkpoint_dir": str(folder / "checkpoints")},
                                     metrics={"port": metrics_port})
    cluster = cql_cluster(cfg.cassandra.contact_points(), cfg.cassandra.port)
    session = cluster.connect()
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = {cfg.cassandra.replication}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "CQRS_CASSANDRA_KEYSPACE": keyspace,
           "CQRS_KAFKA_TOPIC_PREFIX": prefix, "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": cfg.spark.checkpoint_dir,
           "CQRS_METRICS_PORT": str(metrics_port), "CQRS_METRICS_REFRESH": "1"}
    logs = [folder / "run_app.log", folder / "serve.log"]
    procs = []
    for log, args in zip(logs, (["run", "app", APP_REF, "--trigger", "1 second"],
                                ["serve", APP_REF, "--port", str(http_port)])):
        with log.open("w") as sink:
            procs.append(subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", *args],
                                          env=env, stdout=sink, stderr=sink, cwd=folder))
    runner_url, serve_url = f"http://127.0.0.1:{metrics_port}", f"http://127.0.0.1:{http_port}"
    try:
        def both_active() -> bool:
            s = json.loads(_get(runner_url + "/status.json"))
            return {q["name"] for q in s["queries"]} == {"processor", "projector:balances",
                                                         "scheduler", "history"} \
                and all(q["state"] == "active" for q in s["queries"])

        _until("the runner's processor, projector, scheduler and history active", both_active, START_WAIT, logs)
        _until("cqrs serve up", lambda: _get(serve_url + "/health"), 60, logs)
        yield Stack(cfg, runner_url, serve_url, logs, env, procs[0])
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}")
        cluster.shutdown()


def _counters(url: str) -> dict[str, float]:
    """The app's counters from ``/metrics``, parsed by the Prometheus client's parser."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(_get(url + "/metrics").decode()):
        for s in family.samples:
            if s.name.endswith("_total"):
                extra = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "app")
                out[f"{s.name}{{{extra}}}" if extra else s.name] = s.value
    return out


def _acc() -> str:
    return f"acc-{uuid.uuid4().hex[:8]}"


def test_metrics_count_what_was_sent(stack: Stack) -> None:
    before = _counters(stack.runner_url)
    crashing = sorted(DEMO_CRASHING_OWNERS)[0]
    a, b, c = _acc(), _acc(), _acc()
    with CommandClient(app, stack.cfg) as client:
        results = [client.send(a, OpenAccount("ann"), expected_version=0),
                   client.send(b, OpenAccount("bob"), expected_version=0),
                   client.send(c, OpenAccount(crashing), expected_version=0)]
        results = [f.result(WAIT) for f in results]
        results += [client.send(a, OpenAccount("ann"), expected_version=0).result(WAIT),
                    client.send(c, AuditAccount("ivy")).result(WAIT),
                    # a retried send: its first answer again, not a second accepted result
                    client.send(b, OpenAccount("bob"), expected_version=0,
                                command_id=results[1].command_id).result(WAIT)]
    assert [r.status for r in results] == ["accepted"] * 3 + ["rejected", "failed", "accepted"]
    assert results[-1] == results[1]
    sent = {"cqrs_commands_in_total": 6, "cqrs_commands_answered_again_total": 1,
            "cqrs_command_results_total{status=accepted}": 3,
            "cqrs_command_results_total{status=rejected}": 1,
            "cqrs_command_results_total{status=failed}": 1, "cqrs_events_out_total": 3,
            "cqrs_dead_letters_written_total{stage=processor}": 1,
            "cqrs_projector_events_total{projection=balances}": 3}

    def grown(url: str) -> dict[str, float] | None:
        now = _counters(url)
        delta = {k: now.get(k, 0) - before.get(k, 0) for k in sent}
        return delta if delta == sent else None

    assert _until("runner counters", lambda: grown(stack.runner_url), WAIT, stack.logs) == sent
    # cqrs serve shows the runner's counters, and reads the dead letters from Kafka itself
    assert _until("serve counters", lambda: grown(stack.serve_url), 30, stack.logs) == sent
    families = {f.name: f for f in text_string_to_metric_families(
        _get(stack.serve_url + "/metrics").decode())}
    waiting = {s.labels["stage"]: s.value for s in families["cqrs_dead_letters_waiting"].samples}
    assert waiting["processor"] >= 1

    def up() -> dict[str, float] | None:  # a query restarting after a failure is down a while
        found = {s.labels["query"]: s.value for f in text_string_to_metric_families(
            _get(stack.serve_url + "/metrics").decode()) if f.name == "cqrs_query_up"
            for s in f.samples}
        return found if set(found.values()) == {1.0} else None

    assert _until("every query up", up, WAIT, stack.logs) == {
        "processor": 1.0, "projector:balances": 1.0, "scheduler": 1.0, "history": 1.0}
    assert families["cqrs_batch_duration_seconds"].samples  # a histogram per query
    lag = [s for s in families["cqrs_query_lag_records"].samples
           if s.labels["query"] == "processor"]
    assert lag and all(s.value >= 0 for s in lag)

    def caught_up() -> bool:
        s = json.loads(_get(stack.serve_url + "/status.json"))
        (balances,) = s["projections"]
        current = balances["generations"][0]
        # a fresh keyspace and topics: its positions are exactly the 3 events written
        return (current["total_lag"] == 0 and balances["current"] == 1
                and sum(current["positions"].values()) == 3)

    _until("the projection caught up", caught_up, WAIT, stack.logs)


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.fail("the status page test needs Chromium and its driver from the system packages: "
                    "`sudo apt-get install -y chromium chromium-driver` (Debian/Ubuntu), then "
                    "run the test again")
    return browser, driver


def test_status_page_in_a_real_browser(stack: Stack, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def fresh(probe: Callable[[], T]) -> Callable[[], T | None]:
        """``probe``, answering None when the page redrew an element while it was read (the
        page replaces its rows on every refresh), so ``_until`` reads it again."""
        def guarded() -> T | None:
            try:
                return probe()
            except StaleElementReferenceException:
                return None
        return guarded

    browser, driver_path = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1300,1250"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(stack.serve_url + "/")

        def rows() -> dict[str, Any]:
            return {r.get_attribute("data-query"): r for r in
                    driver.find_elements(By.CSS_SELECTOR, "#queries tbody tr")}

        def both_active() -> bool:
            found = rows()
            return set(found) == {"processor", "projector:balances", "scheduler",
                                  "history"} and all(
                r.get_attribute("data-state") == "active" for r in found.values())

        _until("the page shows every query active", fresh(both_active), 60, stack.logs)
        assert driver.find_element(By.ID, "app").text == "bank"

        def commands_in() -> int:
            return int(driver.find_element(By.ID, "counter-commands_in").text.replace(",", ""))

        shown, rows_in = _until("the page shows its counters", fresh(lambda: (
            commands_in(), int(rows()["processor"].get_attribute("data-input-rows")))),
            60, stack.logs)
        acc = _acc()
        with CommandClient(app, stack.cfg) as client:
            futures = [client.send(acc, OpenAccount("zoe"), expected_version=0)]
            futures += [client.send(acc, Deposit(100 * i)) for i in range(1, 4)]
            assert [f.result(WAIT).status for f in futures] == ["accepted"] * 4
        _until("the page counts the 4 commands", fresh(lambda: commands_in() >= shown + 4), 60,
               stack.logs)
        _until("the processor row shows them", fresh(
            lambda: int(rows()["processor"].get_attribute("data-input-rows")) >= rows_in + 4),
            60, stack.logs)
        # in/s, done/s and lag per query: a line needs two points, which under load can take
        # a few refreshes after the first batch
        def lines_of(query: str) -> int:
            return len(driver.find_elements(
                By.CSS_SELECTOR, f'#queries tr[data-query="{query}"] svg.spark polyline'))

        _until("the page draws the processor's and the projector's three charts", fresh(
            lambda: lines_of("processor") == 3 and lines_of("projector:balances") == 3), 60,
            stack.logs)
        def projection_caught_up() -> bool:
            row = driver.find_element(By.CSS_SELECTOR, '#projections tr[data-projection="balances"]')
            return "current" in row.text and "100 %" in row.text

        _until("the page shows the projection caught up", fresh(projection_caught_up), 60,
               stack.logs)
        prefix = stack.cfg.kafka.topic_prefix
        dead_letter_topics = {f"{prefix}bank.dead-letters", f"{prefix}bank.projection-dead-letters"}
        _until("the page lists both dead-letter topics", fresh(lambda: {
            r.get_attribute("data-topic")
            for r in driver.find_elements(By.CSS_SELECTOR, "#dead-letters tbody tr")
        } == dead_letter_topics), 60, stack.logs)
        assert driver.find_element(By.ID, "error").text == ""
        time.sleep(2.5)  # one more refresh, so the charts have their latest point
        update = os.environ.get("CQRS_UPDATE_SCREENSHOTS", "") in ("1", "true", "yes")
        shot = DOCS_SCREENSHOT if update else tmp_path / "status-page.png"
        shot.parent.mkdir(exist_ok=True)
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        driver.quit()


def test_top_prints_the_same_figures(stack: Stack) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "CQRS_KAFKA_TOPIC_PREFIX": stack.cfg.kafka.topic_prefix,
           "CQRS_CASSANDRA_KEYSPACE": stack.cfg.cassandra.keyspace,
           "CQRS_METRICS_PORT": str(stack.cfg.metrics.port)}
    done = subprocess.run([sys.executable, "-m", "cqrs.cli.main", "top", APP_REF, "--once"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status = json.loads(_get(stack.runner_url + "/status.json"))
    assert "cqrs top: bank" in done.stdout
    for q in status["queries"]:
        assert q["name"] in done.stdout
    assert f"commands in: {int(status['counters'].get('commands_in', 0)):,}" in done.stdout
    assert "balances" in done.stdout and "current" in done.stdout


def _batch_totals(output: str, unit: str) -> int:
    """The sum of ``N <unit>`` over the ``batch ...: N <unit> ...`` lines a job printed."""
    import re

    total = 0
    for line in output.splitlines():
        found = re.search(rf"(?:^|\s)batch \S+: ([\d,]+) {unit}\b", line)
        if found:
            total += int(found.group(1).replace(",", ""))
    return total


def test_separate_processes_continue_from_the_same_checkpoints(
        stack: Stack, spark: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # runs last in this module: it stops the runner for good
    stack.runner.terminate()
    assert stack.runner.wait(timeout=120) is not None
    for name, value in stack.env.items():
        if name.startswith("CQRS_"):
            monkeypatch.setenv(name, value)
    acc = _acc()
    with CommandClient(app, stack.cfg) as client:
        future = client.send(acc, OpenAccount("max"), expected_version=0)
        assert client.flush() == 0

        def job(*args: str) -> str:
            # `cqrs run <job> --available-now` in this process, on the session's Spark: another
            # process than the runner's, on its checkpoints (as processes of their own, the two
            # jobs only added two JVM starts, ~20 s)
            sigterm = signal.getsignal(signal.SIGTERM)  # the job's own handler, while it runs
            capsys.readouterr()
            try:
                code = main(["run", *args, APP_REF, "--available-now"])
            finally:
                signal.signal(signal.SIGTERM, sigterm)
            said = capsys.readouterr()
            assert code == 0, said.out[-3000:] + said.err[-3000:]
            return said.out

        # only the command sent since: everything before was committed by the runner's queries
        assert _batch_totals(job("processor"), "commands") == 1
        assert future.result(WAIT).status == "accepted"
        assert _batch_totals(job("projector"), "events") == 1
