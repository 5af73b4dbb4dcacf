"""A stand-in compliance screening service, and the bank's DEMO OF HANDLER FAILURES.

A real bank would call a sanctions / anti-money-laundering screening service from the audit
handler. This stub answers "clear" for everyone, except that it **raises**
:class:`ComplianceServiceError` (a ``RuntimeError``) for the owners in
:data:`DEMO_CRASHING_OWNERS`: that is a deliberate device to show what the framework does when a
handler crashes rather than rejects. Send ``AuditAccount`` to an account owned by ``"mallory"``
and the command gets a ``failed`` result, the command record goes to the dead-letter topic
(stage ``handler``), and the account stays exactly as it was for the next command.

The crash is deterministic (it depends on the owner only), as every handler must be: a re-run
micro-batch fails the same way, and a retry from the dead letters fails again and gets parked.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DEMO_CRASHING_OWNERS", "ComplianceCheck", "ComplianceServiceError"]

DEMO_CRASHING_OWNERS: frozenset[str] = frozenset({"mallory"})


class ComplianceServiceError(RuntimeError):
    """The screening service could not answer (here: on purpose, for the demo owners)."""


class ComplianceCheck:
    """Screens account owners; crashes for ``crashing_owners`` (the demo device)."""

    def __init__(self, crashing_owners: Iterable[str] = DEMO_CRASHING_OWNERS) -> None:
        self.crashing_owners = frozenset(crashing_owners)

    def screen(self, owner: str) -> None:
        """Return if ``owner`` is clear; raise :class:`ComplianceServiceError` for demo owners."""
        if owner in self.crashing_owners:
            raise ComplianceServiceError(
                f"compliance screening of owner {owner!r} crashed (demo of a handler failure: "
                f"owners {sorted(self.crashing_owners)} always crash)"
            )
