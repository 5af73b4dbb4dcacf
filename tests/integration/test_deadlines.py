"""Deadlines on the real stack: the orders example's payment window. Placing an order schedules
its cancellation, paying it cancels the deadline; the scheduler fires what is due as commands
with derived ids, which the processor decides as any command."""

from __future__ import annotations

import datetime as dt
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from cqrs import type_name
from cqrs.client import CommandClient, StateReader
from cqrs.config import CqrsConfig
from cqrs.envelope import from_kafka
from cqrs.kafka_io import read_to_end
from cqrs.processor.job import start_processor
from cqrs.processor.workers import ProcessorOptions
from cqrs.results import result_head
from cqrs.scheduler.job import SchedulerOptions, start_scheduler
from cqrs.topics import AppTopics, topics_for
from domain_examples.orders import (
    CancelUnpaidOrder, OrderCancelled, OrderLine, OrderStatus, PayOrder, PlaceOrder, app,
)
from waiting import wait_for

APP_REF = "domain_examples.orders:app"
WAIT = 120.0
LINES = (OrderLine("sku-1", 2, 500),)


@attrs.frozen
class Running:
    cfg: CqrsConfig
    topics: AppTopics
    scheduler: Any


@pytest.fixture(scope="module")
def running(cqrs_config: CqrsConfig, spark: Any,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    prefix = f"t-deadlines-{uuid.uuid4().hex[:8]}-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix})
    topics = topics_for(app.name, prefix)
    checkpoint = str(tmp_path_factory.mktemp("deadlines") / "processor")
    query = start_processor(spark, cfg, ProcessorOptions(APP_REF, topics=topics, checkpoint=checkpoint))
    scheduler = start_scheduler(cfg, SchedulerOptions(APP_REF, topics=topics))
    try:
        yield Running(cfg, topics, scheduler)
    finally:
        scheduler.stop()
        query.stop()


def _place(client: CommandClient, order: str, window_s: int) -> Any:
    now = dt.datetime.now(dt.timezone.utc)
    result = client.send_and_wait(order, PlaceOrder("c-1", LINES, now, payment_window_s=window_s),
                                  timeout=WAIT)
    assert result.accepted, result
    return result


def _fired(r: Running) -> Counter[str]:
    """Results of deadline commands by command id (answers given again left out)."""
    seen: Counter[str] = Counter()
    for rec in read_to_end(r.cfg, [r.topics.results]):
        head = result_head(rec.value)
        if head is not None and head.command_id.startswith("dl:") and not rec.headers:
            seen[head.command_id] += 1
    return seen


def test_unpaid_orders_are_cancelled_when_their_window_ends_and_paid_ones_are_not(
        running: Running) -> None:
    from cqrs.scheduler.store import pending_deadlines

    r = running
    paid, unpaid = f"o-{uuid.uuid4().hex[:6]}", [f"o-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    with CommandClient(app, r.cfg) as client:
        _place(client, f"warm-up-{uuid.uuid4().hex[:6]}", 3600)  # the processor's first batch
        placed = {o: _place(client, o, 6) for o in [paid, *unpaid]}
        wait_for("the deadline to be written", lambda: pending_deadlines(r.cfg, app, unpaid[0]),
                 timeout=30)
        pending = pending_deadlines(r.cfg, app, unpaid[0])
        assert [(d.name, d.target_id) for d in pending] == [("orders.CancelUnpaidOrder", unpaid[0])]
        assert pending[0].command_id.startswith(f"dl:orders.Order:{unpaid[0]}:orders.CancelUnpaidOrder:")
        assert client.send_and_wait(paid, PayOrder(1000, "pay-1"), timeout=WAIT).accepted
        # cancelled with the payment (written just after its result, with its state row)
        wait_for("the paid order's deadline to go", lambda: pending_deadlines(r.cfg, app, paid) == [],
                 timeout=30)

    def cancelled() -> bool:
        with StateReader(app, r.cfg) as reader:
            return all(reader.get(o).state.status is OrderStatus.CANCELLED for o in unpaid)

    wait_for("the unpaid orders to be cancelled", cancelled, timeout=WAIT)
    with StateReader(app, r.cfg) as reader:
        assert reader.get(paid).state.status is OrderStatus.PAID
    fired = _fired(r)
    assert sorted(fired) == sorted(pending_id(o, placed[o]) for o in unpaid) and set(fired.values()) == {1}
    # the fired command carries the conversation of the order's placing, and the due time
    events = [(env, app.codec.decode(p)) for env, p in
              (from_kafka(e.key, e.value, e.headers) for e in read_to_end(r.cfg, [r.topics.events]))]
    for o in unpaid:
        (env, ev), = [(env, ev) for env, ev in events
                      if env.aggregate_id == o and isinstance(ev, OrderCancelled)]
        assert ev.reason == "unpaid" and env.correlation_id == placed[o].command_id
        assert env.timestamp == placed[o].timestamp + dt.timedelta(seconds=6)
    assert pending_deadlines(r.cfg, app, unpaid[0]) == []


def test_pending_deadlines_over_http_and_the_command_line(running: Running) -> None:
    import json
    import os
    import subprocess
    import sys

    from fastapi.testclient import TestClient

    from cqrs.http.app import create_http_app
    from cqrs.http.context import HttpContext

    r = running
    order = f"o-{uuid.uuid4().hex[:6]}"
    with CommandClient(app, r.cfg) as client:
        placed = _place(client, order, 3600)
    due_at = placed.timestamp + dt.timedelta(seconds=3600)
    due = due_at.replace(microsecond=due_at.microsecond // 1000 * 1000).isoformat()  # ms: stored so
    ctx = HttpContext(app, r.cfg)
    try:
        with TestClient(create_http_app(ctx)) as http:
            wait_for("the deadline over HTTP", lambda: http.get(f"/aggregates/{order}/deadlines").json(),
                     timeout=30)
            body = http.get(f"/aggregates/{order}/deadlines").json()
            assert [(d["name"], d["due"], d["target_id"]) for d in body] == [
                ("orders.CancelUnpaidOrder", due, order)]
            assert http.get("/aggregates/nobody/deadlines").json() == []
            assert http.get(f"/aggregates/{order}/deadlines", params={"type": "nope"}).status_code == 404
    finally:
        ctx.close()
    from cqrs.scheduler.store import open_deadline_store

    store = open_deadline_store(r.cfg, r.topics.base)
    try:  # the gauge: entries not reached yet, the hour-long one among them
        assert store.waiting(int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)) >= 1
    finally:
        store.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "CQRS_KAFKA_TOPIC_PREFIX": r.topics.base.removesuffix(app.name)}
    cli = subprocess.run([sys.executable, "-m", "cqrs.cli.main", "deadlines", "list", APP_REF, order,
                          "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert [d["command_id"] for d in json.loads(cli.stdout)] == [body[0]["command_id"]]


def pending_id(order: str, placed: Any) -> str:
    due_ms = int((placed.timestamp + dt.timedelta(seconds=6)).timestamp() * 1000)
    return f"dl:orders.Order:{order}:{type_name(CancelUnpaidOrder)}:{due_ms}"


def test_an_app_killed_while_deadlines_fire_fires_each_once_after_its_restart(
        cqrs_config: CqrsConfig, tmp_path: Any) -> None:
    """`cqrs run app` SIGKILLed (its whole process group) in the middle of a run of due
    deadlines, then started again: every deadline fired, none applied twice."""
    import os
    import sys
    import time

    from process_group import Jobs

    prefix = f"t-dlkill-{uuid.uuid4().hex[:8]}-"
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix})
    topics = topics_for(app.name, prefix)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "CQRS_KAFKA_TOPIC_PREFIX": prefix,
           "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers, "CQRS_METRICS_PORT": "0",
           "CQRS_SPARK_CHECKPOINT_DIR": str(tmp_path / "ck")}
    jobs = Jobs(tmp_path, env)
    jobs.run("app", "run", "app", APP_REF, "--no-projectors")
    try:
        orders = [f"k-{i}" for i in range(300)]
        with CommandClient(app, cfg) as client:
            assert client.send_and_wait("warm-up", PlaceOrder(
                "c-1", LINES, dt.datetime.now(dt.timezone.utc), 3600), timeout=420).accepted
            now = dt.datetime.now(dt.timezone.utc)
            # due over about six seconds, from ~10 s on
            futures = [client.send(o, PlaceOrder("c-1", LINES, now, payment_window_s=10 + i // 50))
                       for i, o in enumerate(orders)]
            assert all(f.result(WAIT).accepted for f in futures), jobs.log("app")
        time.sleep(max(0.0, (now + dt.timedelta(seconds=12) - dt.datetime.now(dt.timezone.utc))
                       .total_seconds()))
        jobs.kill("app")  # SIGKILL to the group: the scheduler, processor and JVM at once
        r = Running(cfg, topics, None)
        before = len(_fired(r))
        assert 0 < before < len(orders), f"killed with {before} fired: not while firing"
        jobs.run("app", "run", "app", APP_REF, "--no-projectors")

        def all_fired() -> bool:
            return len(_fired(r)) == len(orders)

        wait_for("every deadline to fire after the restart", all_fired, timeout=300)
        time.sleep(3)
        fired = _fired(r)
        assert len(fired) == len(orders) and set(fired.values()) == {1}, fired.most_common(3)
        envelopes = [from_kafka(e.key, e.value, e.headers)[0]
                     for e in read_to_end(cfg, [topics.events])]
        cancelled = Counter(e.aggregate_id for e in envelopes
                            if e.message_type == "orders.OrderCancelled")
        assert sorted(cancelled) == sorted(orders) and set(cancelled.values()) == {1}
    finally:
        jobs.stop_all()
