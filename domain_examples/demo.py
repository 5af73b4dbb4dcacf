"""``cqrs demo``: the five example apps end to end on the real stack, in one command.

It starts the local stack if none is running, runs the command processors of bank, orders,
loyalty, lending and ticketing, lending's process managers, bank's retry job and orders' deadline
scheduler in one Spark session, races clients for loans across aggregates, lets an unpaid
order's payment window run out (a deadline), sends the scripted workload of
:mod:`domain_examples.workload` through the real client (including a race, rejections, a
repeated command id and a handler crash), shows the answers and the dead letters (in the topic,
and as the retry job recorded them), runs the projectors into Cassandra, prints the
read models, forgets a ticketing customer (their personal data, before and after), rebuilds one projection into a new generation, checks everything it printed, and
cleans up what it created (fresh topics, keyspace and checkpoints per run) unless told to keep.
"""

from __future__ import annotations

import base64
import concurrent.futures
import os
import contextlib
import datetime as _dt
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from cqrs.app import App
from cqrs.cli.tables import render_table
from cqrs.config import CqrsConfig
from cqrs.results import CommandResult
from domain_examples.workload import (
    RACE,
    Scripted,
    bank_script,
    check_answers,
    loyalty_script,
    orders_script,
    outcome_of,
    waves,
)

__all__ = ["DemoOptions", "run_demo"]

APP_REFS = {
    "bank": "domain_examples.bank:app",
    "orders": "domain_examples.orders:app",
    "loyalty": "domain_examples.loyalty:app",
    "lending": "domain_examples.lending:app",
    "ticketing": "domain_examples.ticketing:app",
}
STEPS = 10
TICKET_BUYERS = [("c-erin", "Erin Quillfeather", "erin@example.com"),
                 ("c-ann", "Ann Marlowe", "ann@example.com")]
LOAN_BOOKS = [f"book-{i}" for i in range(1, 6)]
DEADLINE_ORDERS = ["ord-dee-paid", "ord-dee-unpaid"]  # a 3-second payment window each


@attrs.frozen
class DemoOptions:
    keep: bool = False  # leave the stack (if the demo started it), topics, keyspace, checkpoints
    rebuild: str | None = "bank:balances"  # app:projection to rebuild at the end; None: skip
    timeout_s: float = 240.0  # for the answers of one wave


class Demo:
    def __init__(self, cfg: CqrsConfig, opts: DemoOptions, say: Callable[[str], None]) -> None:
        self.base_cfg = cfg
        self.opts = opts
        self.say = say
        self.run_id = uuid.uuid4().hex[:6]
        self.workdir = tempfile.mkdtemp(prefix=f"cqrs-demo-{self.run_id}-")
        self.cfg = cfg.with_overrides(
            kafka={"topic_prefix": f"{cfg.kafka.topic_prefix}demo-{self.run_id}."},
            cassandra={"keyspace": f"demo_{self.run_id}"},
            spark={"checkpoint_dir": self.workdir, "shuffle_partitions": 2},
            # ticketing's personal fields: a throw-away master key for the throw-away keyspace
            personal_data={"master_key": base64.b64encode(os.urandom(32)).decode()},
        )
        self.problems: list[str] = []
        self.started = time.monotonic()
        self.step_no = 0

    # ---- output -----------------------------------------------------------------------------

    def step(self, title: str) -> None:
        self.step_no += 1
        self.say(f"\n[{self.step_no}/{STEPS}] {title}  (+{time.monotonic() - self.started:.0f} s)")

    def check(self, ok: bool, what: str, found: Any = None) -> None:
        """Say whether ``what`` held; when not, remember it, with ``found`` (what was seen
        instead, if given: the failed checks are the last lines a test shows)."""
        if not ok and found is not None:
            what = f"{what} (found {found})"
        self.say(f"  {'ok ' if ok else 'FAIL'} {what}")
        if not ok:
            self.problems.append(what)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], **kw: Any) -> None:
        for line in render_table(headers, rows, **kw).splitlines():
            self.say("  " + line)

    # ---- the stack ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def stack(self) -> Iterator[None]:
        from cqrs.devstack import artifacts
        from cqrs.devstack.stack import DevStack

        local = self.base_cfg.kafka.bootstrap_servers == f"127.0.0.1:{self.base_cfg.dev.kafka_port}"
        stack = DevStack(self.base_cfg)
        started = False
        if not local:
            self.say(f"  using the configured services: Kafka {self.base_cfg.kafka.bootstrap_servers}, "
                     f"Cassandra {self.base_cfg.cassandra.hosts}")
        elif all(s.running for s in stack.status()):
            self.say("  the local stack is running: using it (it stays up afterwards)")
        else:
            missing = [c for c in artifacts.COMPONENTS if not artifacts.is_installed(self.base_cfg.dev, c)]
            if missing:
                self.say(f"  resolving {', '.join(missing)} from Maven Central (once; a few minutes)")
                artifacts.install(self.base_cfg.dev, say=lambda m: self.say("    " + m))
            stack.up(say=lambda m: self.say("    " + m))
            started = True
        try:
            yield
        finally:
            if started and not self.opts.keep:
                self.say("  stopping the local stack the demo started (`--keep` leaves it up)")
                stack.down(say=lambda m: self.say("    " + m))

    # ---- commands -----------------------------------------------------------------------------

    def send_workload(self, clients: dict[str, list[Any]]) -> list[tuple[Scripted, CommandResult]]:
        scripts = [*bank_script(), *orders_script(), *loyalty_script()]
        answered: list[tuple[Scripted, CommandResult]] = []
        for batch in waves(scripts):
            wave = batch[0].wave
            t0 = time.monotonic()
            futures = [clients[s.app][s.client].send(s.aggregate_id, s.command, s.expected_version,
                                                     s.command_id) for s in batch]
            deadline = t0 + self.opts.timeout_s
            while True:
                _, pending = concurrent.futures.wait(
                    futures, timeout=min(5.0, max(0.0, deadline - time.monotonic())))
                if not pending:
                    break
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"wave {wave}: {len(pending)} of {len(futures)} commands "
                                       f"unanswered after {self.opts.timeout_s:.0f} s")
                self.say(f"    wave {wave}: {len(futures) - len(pending)}/{len(futures)} answered ...")
            results = [f.result() for f in futures]
            answered += list(zip(batch, results, strict=True))
            outcome = {k: sum(1 for r in results if r.status == k) for k in ("accepted", "rejected", "failed")}
            self.say(f"  wave {wave}: {len(batch)} commands answered in {time.monotonic() - t0:.1f} s "
                     f"({outcome['accepted']} accepted, {outcome['rejected']} rejected, "
                     f"{outcome['failed']} failed)")
        return answered

    def place_ticket_orders(self, client: Any) -> None:
        from domain_examples.ticketing import PlaceTicketOrder

        futures = [client.send(f"tix-{cid}", PlaceTicketOrder(cid, name, mail, "Tosca", 2),
                               expected_version=0) for cid, name, mail in TICKET_BUYERS]
        results = [f.result(self.opts.timeout_s) for f in futures]
        self.say(f"  ticketing: {len(results)} ticket orders with the buyer's name and e-mail "
                 "(personal data, encrypted with each buyer's key): "
                 f"{', '.join(r.status for r in results)}")

    def forget_a_customer(self, app: App) -> None:
        from cqrs.personal import SEALED_PREFIX
        from cqrs.personal.stack import forget
        from domain_examples.ticketing import TicketOrders
        from projections.personal import forget_step, stack_store
        from projections.query import ProjectionReader
        from projections.store import table_base
        from projections.stores import cached_store

        raw = cached_store(self.cfg)
        reader = ProjectionReader(app, stack_store(raw, self.cfg, app), generation_ttl=0.0)
        keys = [f"tix-{cid}" for cid, _, _ in TICKET_BUYERS]

        def show(when: str) -> list[Any]:
            views = [reader.get("ticket_orders", k) for k in keys]
            self.say(f"  ticketing / ticket_orders {when}")
            self.table(["order_id", "customer_id", "customer_name", "show", "tickets"],
                       [[(v or {}).get(c) for c in ("order_id", "customer_id", "customer_name",
                                                     "show", "tickets")] for v in views])
            return views

        before = show("before")
        self.check([(v or {}).get("customer_name") for v in before] ==
                   [name for _, name, _ in TICKET_BUYERS],
                   "the read model shows each buyer's name (stored encrypted, opened to read)")
        base = table_base(app.name, "ticket_orders")
        generation = raw.generations(base).current or 1
        sealed = {k: v.values.get("customer_name") for k, v in
                  raw.scan_views(TicketOrders(), base, generation) if v.values}
        self.say(f"  as stored in Cassandra: customer_name of tix-c-erin = "
                 f"{str(sealed.get('tix-c-erin'))[:40]}...")
        self.check(all(str(s).startswith(SEALED_PREFIX) for s in sealed.values()),
                   "Cassandra holds only ciphertext of the names")
        self.say("  $ cqrs forget domain_examples.ticketing:app c-erin")
        outcome = forget(self.cfg, app, "c-erin", steps=[forget_step],
                         report=lambda line: self.say(f"    {line}"))
        after = show("after forgetting c-erin")
        self.check(outcome.deleted_now and outcome.rows_rewritten == 1
                   and (after[0] or {}).get("customer_name") == "<forgotten>"
                   and after[1] == before[1]
                   and {**(after[0] or {}), "customer_name": None} ==
                   {**(before[0] or {}), "customer_name": None},
                   "c-erin's name reads <forgotten> (key deleted, row rewritten), the rest of "
                   "the order and c-ann's are unchanged")

    def show_answers(self, answered: list[tuple[Scripted, CommandResult]]) -> None:
        order = list(APP_REFS)
        interesting = sorted(((s, r) for s, r in answered if s.app != "orders" or s.expect != "accepted"),
                             key=lambda sr: (order.index(sr[0].app), sr[0].wave))
        self.table(["app", "aggregate", "command", "note", "answer", "version", "reason"],
                   [(s.app, s.aggregate_id, type(s.command).__name__, s.note, outcome_of(r), r.version,
                     r.reason or r.message) for s, r in interesting], max_width=56, right=["version"])
        orders = [r for s, r in answered if s.app == "orders"]
        self.say(f"  (and {sum(r.accepted for r in orders) } accepted orders commands not listed)")
        problems = check_answers([(s, outcome_of(r)) for s, r in answered])
        self.check(not problems, "every command got the answer the script announces"
                   + ("" if not problems else ": " + "; ".join(problems)))
        race = [r for s, r in answered if s.expect == RACE]
        self.check(sorted(r.status for r in race) == ["accepted", "rejected"],
                   "of two clients writing at version 2, exactly one won")
        dup = [r for s, r in answered if s.command_id == "demo-bob-deposit-1"]
        self.check(len(dup) == 2 and dup[0] == dup[1],
                   "the repeated command id got the first answer again (same version "
                   f"{dup[0].version if dup else '?'}), not a second deposit")

    def show_dead_letters(self) -> None:
        from cqrs.deadletters import list_dead_letters
        from cqrs.topics import topics_for

        letters = list_dead_letters(self.cfg, topics_for("bank", self.cfg.kafka.topic_prefix))
        self.table(["position", "stage", "error", "aggregate", "command"],
                   [(d.position, d.stage, f"{d.error_type}: {d.error}", d.aggregate_id,
                     d.message_type) for d in letters], max_width=60)
        # a letter is written at least once: a batch decided again (after a crash, or after a
        # bridge that overran its lease) writes the same letter again, which the retry job
        # records once (docs/dead-letters.md); different letters would be a bug
        copies = {(d.source_topic, d.source_partition, d.source_offset, d.stage, d.error_type,
                   d.error, d.attempt, d.key, d.value): d for d in letters}
        found = [(d.stage, d.error_type) for d in copies.values()]
        written = "" if len(letters) == len(copies) else \
            f" (written {len(letters)} times, the same letter: at least once)"
        self.check(found == [("handler", "ComplianceServiceError")],
                   "the crashing handler's command is in bank's dead-letter topic, untouched"
                   + written, found)
        self.show_retry_letters()

    def show_retry_letters(self) -> None:
        from cqrs.retrier.operators import list_letters
        from cqrs.retrier.plan import LetterFilter
        from cqrs.retrier.store import RetryStore
        from cqrs.topics import topics_for

        self.say("  as the retry job recorded them (`cqrs dlq list domain_examples.bank:app`):")
        store = RetryStore(self.cfg, topics_for("bank", self.cfg.kafka.topic_prefix).base)
        try:
            listing = list_letters(store, LetterFilter())
        finally:
            store.close()
        self.table(["command id", "state", "attempts", "aggregate", "error"],
                   [(r.command_id, r.state, r.attempts, r.aggregate_id,
                     f"{r.error_type}: {r.error}") for r in listing.letters], max_width=60)
        recorded = [(r.state, r.error_type) for r in listing.letters]
        self.check(recorded == [("parked", "ComplianceServiceError")],
                   "the retry job parked it for an operator at once: bank declares no transient "
                   "error, so a handler crash is an answer, not something to wait for", recorded)

    # ---- process managers ---------------------------------------------------------------------

    def race_for_loans(self, client: Any) -> None:
        """Ann asks for five books at once; the member allows three loans. The lending process
        manager carries each request from the book to the member and back; the refused ones
        are cancelled (the compensation). Each request's client waits for its conversation."""
        from domain_examples.lending import AddBook, BookLent, RegisterMember, RequestLoan

        setup = [client.send("ann", RegisterMember("Ann")),
                 *(client.send(b, AddBook(f"title {b}")) for b in LOAN_BOOKS)]
        self.check(all(client.wait(f, self.opts.timeout_s).accepted for f in setup),
                   "ann registered and five books added")
        requests = [client.send(b, RequestLoan(member_id="ann")) for b in LOAN_BOOKS]
        results = [client.wait(f, self.opts.timeout_s) for f in requests]
        with concurrent.futures.ThreadPoolExecutor(len(results)) as pool:
            ends = list(pool.map(lambda r: client.wait_conversation(
                r.command_id, self.opts.timeout_s)[1], results))
        self.table(["book", "request", "conversation ended with"],
                   [(b, r.status, repr(e)) for b, r, e in zip(LOAN_BOOKS, results, ends, strict=True)],
                   max_width=60)
        lent = [e for e in ends if isinstance(e, BookLent)]
        cancelled = [e for e in ends if not isinstance(e, BookLent)]
        self.check(len(lent) == 3 and len(cancelled) == 2
                   and all(getattr(e, "reason", "") == "limit_reached" for e in cancelled),
                   "ann holds three loans: the other two were refused by the member and "
                   "cancelled at their book (each client waited for its conversation's end)")

    # ---- deadlines ----------------------------------------------------------------------------

    def expire_unpaid(self, client: Any, orders_app: App) -> None:
        """Two orders with a 3-second payment window: one is paid at once (its deadline is
        cancelled), the other is not, and the scheduler sends its CancelUnpaidOrder when the
        window ends; the order's own handler cancels it."""
        from cqrs.client.query import StateReader
        from domain_examples.orders import OrderLine, OrderStatus, PayOrder, PlaceOrder

        now = _dt.datetime.now(_dt.timezone.utc)
        placed = [client.send(o, PlaceOrder("c-dee", (OrderLine("sku-9", 1, 700),), now,
                                            payment_window_s=3)) for o in DEADLINE_ORDERS]
        self.check(all(client.wait(f, self.opts.timeout_s).accepted for f in placed),
                   "two orders placed with a 3-second payment window")
        paid = client.send(DEADLINE_ORDERS[0], PayOrder(700, "pay-dee"))
        self.check(client.wait(paid, self.opts.timeout_s).accepted, f"{DEADLINE_ORDERS[0]} paid at once")
        deadline = time.monotonic() + self.opts.timeout_s
        with StateReader(orders_app, self.cfg) as reader:
            while True:
                states = {o: reader.get(o) for o in DEADLINE_ORDERS}
                if states[DEADLINE_ORDERS[1]].state.status is OrderStatus.CANCELLED \
                        or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        self.table(["order", "status", "version"],
                   [(o, s.state.status.value, s.version) for o, s in states.items()])
        self.check(states[DEADLINE_ORDERS[0]].state.status is OrderStatus.PAID
                   and states[DEADLINE_ORDERS[1]].state.status is OrderStatus.CANCELLED,
                   f"{DEADLINE_ORDERS[1]} was cancelled by its deadline when its window ended, "
                   f"{DEADLINE_ORDERS[0]}'s deadline was cancelled by the payment")

    # ---- read models --------------------------------------------------------------------------

    def show_read_models(self, apps: dict[str, App]) -> None:
        from projections.query import ProjectionReader
        from projections.stores import cached_store

        store = cached_store(self.cfg)
        bank = ProjectionReader(apps["bank"], store)
        accounts = ["acc-alice", "acc-bob", "acc-mallory"]
        views = [bank.get("balances", a) for a in accounts]
        self.say("  bank / balances")
        self.table(list(views[0] or {"account_id": None}),
                   [list(v.values()) for v in views if v is not None])
        expected = {"acc-alice": 90_00, "acc-bob": 45_00, "acc-mallory": 10_00}
        got = {a: (v or {}).get("balance_cents") for a, v in zip(accounts, views)}
        if got.get("acc-alice") == 70_00:  # client B won the race (a 50.00 withdrawal)
            expected["acc-alice"] = 70_00
        self.check(got == expected, f"balances in cents are {expected}")

        orders = ProjectionReader(apps["orders"], store)
        items = [i for page in orders.pages("customer_orders", "c-ann", page_size=12) for i in page.items]
        self.say(f"  orders / customer_orders for c-ann: {len(items)} items in pages of 12, "
                 "the newest five:")
        self.table(list(items[0]), [list(i.values()) for i in items[:5]], max_width=32)
        ids = [i["order_id"] for i in items]
        self.check(ids == [f"ord-ann-{n:02d}" for n in range(39, 9, -1)],
                   "c-ann placed 40 orders; the view holds exactly the newest 30, newest first")
        last = orders.get("orders", "ord-ann-39")
        self.check(last is not None and str(last.get("status", "")).lower().endswith("cancelled"),
                   f"ord-ann-39 shows as cancelled ({(last or {}).get('status')})")

        loyalty = ProjectionReader(apps["loyalty"], store)
        customers = ["c-ann", "c-ben", "c-cy"]
        points = [loyalty.get("customer_points", c) for c in customers]
        self.say("  loyalty / customer_points (purchases at two stores, re-keyed by customer)")
        self.table(list(points[0] or {"customer_id": None}),
                   [list(p.values()) for p in points if p is not None])
        got_points = {c: (p or {}).get("points") for c, p in zip(customers, points)}
        self.check(got_points == {"c-ann": 25 + 80 + 4, "c-ben": 12 + 100, "c-cy": 9},
                   f"points per customer add up across stores: {got_points}")

        lending = ProjectionReader(apps["lending"], store)
        loans = lending.category("member_loans", "ann").items
        self.say("  lending / member_loans for ann (a category of loans, from the books' events)")
        self.table(list(loans[0]) if loans else ["loan"], [list(i.values()) for i in loans],
                   max_width=32)
        self.check(len(loans) == 3 and {i["status"] for i in loans} == {"lent"},
                   "ann's loans read model lists her three loans")

    # ---- the run --------------------------------------------------------------------------------

    def run(self) -> int:
        from cqrs.client.command_client import CommandClient
        from cqrs.loading import load_app
        from cqrs.processor.job import prepare_processor, start_processor
        from cqrs.processor.workers import ProcessorOptions
        from cqrs.retrier.job import RetrierOptions, start_retrier
        from cqrs.spark_session import spark_session, start_query
        from projections.rebuild import rebuild_projection

        from cqrs.process.job import ProcessManagerOptions, start_process_manager
        from cqrs.scheduler.job import SchedulerOptions, start_scheduler

        self.say(f"cqrs demo {self.run_id}: bank, orders, loyalty, lending and ticketing on Kafka, Spark and "
                 "Cassandra")
        self.step("the local stack")
        with self.stack():
            self.step("Spark, the five command processors, lending's process managers, bank's "
                      "retry job and orders' deadline scheduler")
            log = self.base_cfg.dev.home_path / "logs" / f"demo-{self.run_id}-spark.log"
            spark = spark_session(self.cfg, f"cqrs-demo-{self.run_id}", log_file=log)
            self.say(f"  Spark's own output goes to {log}")
            queries: list[Any] = []
            clients: dict[str, list[Any]] = {}
            try:
                apps = {name: load_app(ref) for name, ref in APP_REFS.items()}
                # topics, state tables and schemas of the five apps at once (round trips, no
                # Spark); the queries themselves start one at a time
                with concurrent.futures.ThreadPoolExecutor(len(APP_REFS)) as pool:
                    prepared = list(pool.map(lambda ref: prepare_processor(
                        self.cfg, ProcessorOptions(ref)), APP_REFS.values()))
                starts: list[Callable[[], Any]] = [
                    lambda opts=opts: start_processor(spark, self.cfg, opts) for opts in prepared]
                # after the processors: processAllAvailable below then sees their dead letters
                starts.append(lambda: start_retrier(spark, self.cfg,
                                                    RetrierOptions(APP_REFS["bank"])))
                starts += [lambda pm=pm: start_process_manager(
                    self.cfg, ProcessManagerOptions(APP_REFS["lending"], pm.name))
                    for pm in apps["lending"].process_managers]
                starts.append(lambda: start_scheduler(self.cfg, SchedulerOptions(APP_REFS["orders"])))
                for start in starts:  # one at a time: see wait_until_started
                    queries.append(start_query(start))
                self.say(f"  {len(queries)} jobs running: 5 processors, bank's retry job, "
                         f"lending's process managers and orders' scheduler (topics prefixed "
                         f"{self.cfg.kafka.topic_prefix!r}, Cassandra keyspace {self.cfg.cassandra.keyspace!r})")
                clients = {name: [CommandClient(app, self.cfg) for _ in range(2 if name == "bank" else 1)]
                           for name, app in apps.items()}

                self.step("the scripted workload, through the command client")
                answered = self.send_workload(clients)
                self.show_answers(answered)
                self.place_ticket_orders(clients["ticketing"][0])

                self.step("a race across aggregates: five loans for a member allowed three")
                self.race_for_loans(clients["lending"][0])

                self.step("a deadline: an order not paid within its payment window is cancelled")
                self.expire_unpaid(clients["orders"][0], apps["orders"])

                self.step("dead letters (`cqrs dlq list domain_examples.bank:app --raw`)")
                for q in queries:
                    q.processAllAvailable()  # every answered batch has written all its events
                self.show_dead_letters()

                self.step("projectors: folding the event logs into Cassandra")
                self.run_projectors(spark, apps)

                self.step("read models")
                self.show_read_models(apps)

                self.step("personal data: forgetting a customer (crypto-shredding)")
                self.forget_a_customer(apps["ticketing"])

                self.step("rebuilding a projection from the event log into a new generation")
                if self.opts.rebuild:
                    self.rebuild(spark, apps, rebuild_projection)
                else:
                    self.say("  skipped (--no-rebuild)")
            finally:
                for group in clients.values():
                    for c in group:
                        c.close()
                for q in queries:
                    q.stop()
                spark.stop()
                from cqrs.personal.stack import close_key_stores

                close_key_stores()  # ticketing's keys: the demo leaves no connection open
                self.cleanup()
        seconds = time.monotonic() - self.started
        if self.problems:
            self.say(f"\ndemo finished in {seconds:.0f} s with {len(self.problems)} failed check(s):")
            for p in self.problems:
                self.say(f"  - {p}")
            return 1
        self.say(f"\ndemo finished in {seconds:.0f} s: every check passed")
        return 0

    def run_projectors(self, spark: Any, apps: dict[str, App]) -> None:
        """Every app's projectors at once, each until it applied what its events topic held
        (their tables made first, one app after the other: no two apps' schema changes at
        once). Their queries read Kafka, so starting them together is safe, unlike the
        processors' (see ``wait_until_started``); one app after the other took ~35 s instead
        of ~22 s at a load of 7 on 2 cores."""
        from projections.local import ensure_current_generation
        from projections.model import select
        from projections.runner import run_projectors
        from projections.store import table_base
        from projections.stores import cached_store

        store = cached_store(self.cfg)
        for app in apps.values():
            for p in select(app, ()):
                ensure_current_generation(store, p, table_base(app.name, p.name))
        with concurrent.futures.ThreadPoolExecutor(len(apps)) as pool:
            runs = [pool.submit(run_projectors, spark, self.cfg, APP_REFS[name], available_now=True,
                                report=lambda m, n=name: self.say(f"    {n}: {m}"))
                    for name in apps]
            for run in runs:
                run.result()  # (the first failure, after every run ended)

    def rebuild(self, spark: Any, apps: dict[str, App], rebuild_projection: Any) -> None:
        from projections.query import ProjectionReader
        from projections.stores import cached_store

        app_name, projection = self.opts.rebuild.split(":", 1)  # type: ignore[union-attr]
        reader = ProjectionReader(apps[app_name], cached_store(self.cfg), generation_ttl=0.0)
        keys = ["acc-alice", "acc-bob", "acc-mallory"] if projection == "balances" else []
        before = [reader.get(projection, k) for k in keys]
        report = rebuild_projection(spark, self.cfg, APP_REFS[app_name], projection,
                                    report=lambda m: self.say("    " + m), drop_old=True)
        after = [reader.get(projection, k) for k in keys]
        self.check(after == before and report.new_generation == (report.old_generation or 0) + 1,
                   f"{app_name}/{projection}: generation {report.new_generation} ({report.events} "
                   f"events in {report.seconds:.1f} s) equals generation {report.old_generation}")

    def cleanup(self) -> None:
        if self.opts.keep:
            self.say(f"\nkept: topics {self.cfg.kafka.topic_prefix}*, keyspace "
                     f"{self.cfg.cassandra.keyspace}, checkpoints in {self.workdir}")
            return
        from cqrs.topics import delete_topics, list_topics

        with contextlib.suppress(Exception):
            delete_topics(self.cfg, list_topics(self.cfg, self.cfg.kafka.topic_prefix))
        with contextlib.suppress(Exception):
            from projections.stores import cached_store

            store = cached_store(self.cfg)
            drop = getattr(store, "drop_keyspace", None)
            if drop is not None:
                drop()
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.say("\ncleaned up the demo's topics, keyspace and checkpoints (`--keep` leaves them)")


def run_demo(cfg: CqrsConfig, opts: DemoOptions = DemoOptions(),
             say: Callable[[str], None] | None = None) -> int:
    """Run the demo; 0 when every check passed."""
    def default_say(message: str) -> None:
        print(message, flush=True)

    return Demo(cfg, opts, say or default_say).run()


if __name__ == "__main__":
    from cqrs.config import load_config

    sys.exit(run_demo(load_config()))
