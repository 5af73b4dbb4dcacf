"""``cqrs run app`` runs the retry job as one more query of its driver when the app declares
transient errors: a command failing once is retried and accepted, and the status JSON shows the
retrier's query and counters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from cqrs.client import CommandClient
from cqrs.config import CqrsConfig
from cqrs.topics import ensure_topics, topics_for

APPS = Path(__file__).parent / "apps"
sys.path.insert(0, str(APPS))
import flaky_app  # noqa: E402
from process_group import stop
from ports import free_port


def _status(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url + "/status.json", timeout=5) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]
    except OSError:
        return None


def test_run_app_runs_the_retrier_beside_the_processor(cqrs_config: CqrsConfig,
                                                       tmp_path: Path) -> None:
    prefix = f"t-rapp-{uuid.uuid4().hex[:8]}-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix})
    topics = topics_for(flaky_app.app.name, prefix)
    ensure_topics(cfg, topics)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(APPS), *sys.path]),
           "CQRS_KAFKA_TOPIC_PREFIX": prefix, "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers,
           "CQRS_SPARK_CHECKPOINT_DIR": str(tmp_path / "ck"), "CQRS_METRICS_PORT": str(port),
           "CQRS_RETRIER_INTERVAL": "0.5", "CQRS_RETRIER_TRIGGER": "500 milliseconds"}
    log = tmp_path / "app.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cqrs.cli.main", "run", "app", "flaky_app:app",
                                 "--trigger", "300 milliseconds"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    client = CommandClient(flaky_app.app, cfg)
    try:
        flag = tmp_path / "flag"
        flag.write_text("1")  # fails once, then the service is back
        result = client.send_and_wait("w-1", flaky_app.Charge(3, str(flag)), timeout=180)
        assert result.status == "accepted", log.read_text()[-3000:]
        assert len(flag.with_suffix(".calls").read_text().split()) == 2
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        status = _status(url)
        while time.monotonic() < deadline and not (
                status and status["counters"].get("retries_delivered", 0) >= 1):
            time.sleep(0.5)
            status = _status(url)
        assert status is not None
        queries = {q["name"]: q for q in status["queries"]}
        assert set(queries) == {"processor", "retrier", "scheduler", "history"}
        assert queries["retrier"]["state"] == "active"
        assert queries["retrier"]["input_topic"] == topics.dead_letters
        assert status["counters"]["retries_delivered"] == 1
        assert status["counters"]["letters_recorded"] >= 1
    finally:
        client.close()
        stop(proc)
