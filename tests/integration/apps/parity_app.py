"""An app with a bit of everything the in-process runner must reproduce, for
tests/integration/test_runner_parity.py: the lending example's aggregates, both of its process
managers (one stateless, one stateful) and its category read model, plus the flaky app's wallet,
whose handler fails while a flag file says so (transient: retried after a backoff), and a
per-wallet read model. Imported by reference (``parity_app:app``) with this folder on
``PYTHONPATH``.
"""

from __future__ import annotations

from cqrs.app import App
from cqrs.retries import Backoff, RetryPolicy
from domain_examples.lending import (
    Book, BookHandler, Lending, Member, MemberHandler, MemberLoans, Strikes,
)
from flaky_app import Charged, ServiceUnavailable, Wallet, WalletHandler
from projections import Projection

__all__ = ["WalletTotals", "app"]


class WalletTotals(Projection):
    """Per wallet, what was charged and how often."""

    name = "wallet_totals"
    aggregate = Wallet
    key = "wallet_id"
    columns = {"total": int, "charges": int}
    defaults = {"total": 0, "charges": 0}

    def on_charged(self, view: dict, e: Charged) -> None:
        view["total"] += e.amount
        view["charges"] += 1


app = App("parity", aggregates=[Book, Member, Wallet],
          handlers=[BookHandler, MemberHandler, WalletHandler],
          projections=[MemberLoans, WalletTotals], process_managers=[Lending, Strikes],
          retries=RetryPolicy(transient=[ServiceUnavailable],
                              default=Backoff(initial_s=0.5, multiplier=2.0, max_s=4.0, jitter=0,
                                              max_attempts=4)))
