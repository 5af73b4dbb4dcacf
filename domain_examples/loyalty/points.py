"""The points rule: one point per whole currency unit spent (cents are not rounded up)."""

from __future__ import annotations

__all__ = ["CENTS_PER_POINT", "points_for"]

CENTS_PER_POINT = 100


def points_for(amount_cents: int) -> int:
    """Points earned by a purchase of ``amount_cents``: ``12_345`` cents -> 123 points."""
    return amount_cents // CENTS_PER_POINT if amount_cents > 0 else 0
