"""The scripted workload of ``cqrs demo``: commands for the three example apps, each with the
outcome it must have, so the demo can show and check every answer.

It exercises what a newcomer should see once: accepted commands, a concurrency conflict (two
writers, one expected version), a business rejection, a client retry with the same command id,
and a handler failure that lands in the dead-letter topic.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator

import attrs

from cqrs.results import CommandResult

from domain_examples import bank, loyalty, orders

__all__ = ["DEMO_T0", "RACE", "Scripted", "bank_script", "check_answers", "loyalty_script", "orders_script", "outcome_of", "waves"]

RACE = "race"
DEMO_T0 = _dt.datetime(2026, 11, 2, 9, 0, tzinfo=_dt.timezone.utc)


@attrs.frozen
class Scripted:
    """One command of the script and the answer it must get.

    ``wave``: commands of a wave are sent together, after every answer of the previous wave
    arrived (so "two writers at once" really race, and a later command sees the earlier ones).
    ``expect``: ``accepted``, ``rejected:<code>``, ``failed:<error type>``, or :data:`RACE`:
    of the commands of a wave marked RACE for one aggregate, exactly one is accepted and the
    others are rejected with ``wrong_expected_version`` (which one wins is up to Kafka).
    """

    wave: int
    app: str
    aggregate_id: str
    command: object
    expect: str
    note: str = ""
    expected_version: int | None = None
    command_id: str | None = None
    client: int = 0  # which of the app's clients sends it (two clients race in the bank)


def bank_script() -> list[Scripted]:
    b = "bank"
    return [
        Scripted(0, b, "acc-alice", bank.OpenAccount("alice"), "accepted", "open", expected_version=0),
        Scripted(0, b, "acc-bob", bank.OpenAccount("bob"), "accepted", "open", expected_version=0),
        Scripted(0, b, "acc-mallory", bank.OpenAccount("mallory"), "accepted", "open", expected_version=0),
        Scripted(1, b, "acc-alice", bank.Deposit(120_00), "accepted", "deposit"),
        Scripted(1, b, "acc-bob", bank.Deposit(40_00), "accepted", "deposit"),
        Scripted(1, b, "acc-mallory", bank.Deposit(15_00), "accepted", "deposit"),
        Scripted(1, b, "acc-alice", bank.OpenAccount("alice"), "rejected:wrong_expected_version",
                 "open again, expecting a new account", expected_version=0),
        # two clients withdraw from alice's account, both having read version 2
        Scripted(2, b, "acc-alice", bank.Withdraw(30_00), RACE,
                 "race: client A at version 2", expected_version=2, client=0),
        Scripted(2, b, "acc-alice", bank.Withdraw(50_00), RACE,
                 "race: client B at version 2", expected_version=2, client=1),
        Scripted(2, b, "acc-bob", bank.Withdraw(500_00), "rejected:insufficient_funds",
                 "withdraw more than the balance"),
        Scripted(2, b, "acc-bob", bank.Deposit(5_00), "accepted", "deposit (first try)",
                 command_id="demo-bob-deposit-1"),
        Scripted(3, b, "acc-bob", bank.Deposit(5_00), "accepted",
                 "the same command id again: answered, not re-run", command_id="demo-bob-deposit-1"),
        Scripted(3, b, "acc-mallory", bank.AuditAccount("eve"), "failed:ComplianceServiceError",
                 "handler crash -> dead letter"),
        Scripted(4, b, "acc-mallory", bank.Withdraw(5_00), "accepted", "the account still works"),
    ]


def _order_lines(n: int) -> tuple[orders.OrderLine, ...]:
    return (orders.OrderLine(f"sku-{n % 7}", 1 + n % 3, 4_99 + 100 * (n % 5)),)


def _order_total(n: int) -> int:
    return sum(line.quantity * line.unit_price_cents for line in _order_lines(n))


def orders_script(ann_orders: int = 40) -> list[Scripted]:
    """``c-ann`` places ``ann_orders`` orders (one a minute), pays all but the last four, ships
    the first 30 and cancels the last; ``c-ben`` places three."""
    o = "orders"
    out: list[Scripted] = []

    def place(order_id: str, customer: str, n: int, minute: int) -> None:
        at = DEMO_T0 + _dt.timedelta(minutes=minute)
        out.append(Scripted(0, o, order_id, orders.PlaceOrder(customer, _order_lines(n), at),
                            "accepted", "place", expected_version=0))

    for n in range(ann_orders):
        place(f"ord-ann-{n:02d}", "c-ann", n, n)
    for n in range(3):
        place(f"ord-ben-{n:02d}", "c-ben", n, 5 + n)
    for n in range(ann_orders - 4):
        out.append(Scripted(1, o, f"ord-ann-{n:02d}", orders.PayOrder(_order_total(n), f"pay-{n}"),
                            "accepted", "pay"))
    for n in range(min(30, ann_orders - 4)):
        out.append(Scripted(2, o, f"ord-ann-{n:02d}", orders.ShipOrder("DHL", f"trk-{n:04d}"),
                            "accepted", "ship"))
    last = f"ord-ann-{ann_orders - 1:02d}"
    out.append(Scripted(2, o, last, orders.CancelOrder("changed my mind"), "accepted", "cancel"))
    out.append(Scripted(3, o, last, orders.PayOrder(_order_total(ann_orders - 1), "late"),
                        "rejected:order_cancelled", "pay a cancelled order"))
    out.append(Scripted(3, o, "ord-ben-00", orders.ShipOrder("UPS", "trk-x"), "rejected:not_paid",
                        "ship an unpaid order"))
    return out


def loyalty_script() -> list[Scripted]:
    """Purchases at two stores by three customers; one invoice scanned twice."""
    purchases = [
        ("store-north", "inv-n-1", "c-ann", 25_00), ("store-north", "inv-n-2", "c-ben", 12_50),
        ("store-south", "inv-s-1", "c-ann", 80_00), ("store-south", "inv-s-2", "c-cy", 9_99),
        ("store-north", "inv-n-3", "c-ann", 4_00), ("store-south", "inv-s-3", "c-ben", 100_00),
    ]
    out = [Scripted(0 if i < 3 else 1, "loyalty", store, loyalty.RecordPurchase(inv, cust, cents),
                    "accepted", "purchase") for i, (store, inv, cust, cents) in enumerate(purchases)]
    out.append(Scripted(2, "loyalty", "store-north", loyalty.RecordPurchase("inv-n-2", "c-ben", 12_50),
                        "rejected:duplicate_invoice", "the same invoice scanned twice"))
    return out


def waves(script: list[Scripted]) -> Iterator[list[Scripted]]:
    """The script's commands grouped by wave, in wave order."""
    for wave in sorted({s.wave for s in script}):
        yield [s for s in script if s.wave == wave]


def outcome_of(result: CommandResult) -> str:
    """A result written like :attr:`Scripted.expect`: ``accepted``, ``rejected:<code>`` or
    ``failed:<error type>``."""
    if result.status == "rejected":
        return f"rejected:{result.code}"
    if result.status == "failed":
        return f"failed:{result.error_type}"
    return result.status


def check_answers(answered: list[tuple[Scripted, str]]) -> list[str]:
    """What went differently from the script (empty: everything as announced). ``answered``
    pairs each scripted command with its outcome, written like ``Scripted.expect``."""
    problems = [f"{s.app} {s.aggregate_id} ({s.note}): expected {s.expect}, got {got}"
                for s, got in answered if s.expect != RACE and got != s.expect]
    races: dict[tuple[str, int, str], list[str]] = {}
    for s, got in answered:
        if s.expect == RACE:
            races.setdefault((s.app, s.wave, s.aggregate_id), []).append(got)
    for (app, _, aggregate_id), outcomes in races.items():
        if sorted(outcomes) != sorted(["accepted", *["rejected:wrong_expected_version"] * (len(outcomes) - 1)]):
            problems.append(f"{app} {aggregate_id}: racing commands answered {outcomes}, expected "
                            "exactly one accepted and the others rejected:wrong_expected_version")
    return problems
