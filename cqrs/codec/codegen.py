"""What the codec's generated functions share: the namespace their source refers to by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Namespace"]


class Namespace:
    """The constants one piece of generated source refers to, each bound under a fresh name."""

    def __init__(self, base: Mapping[str, Any]) -> None:
        self.namespace: dict[str, Any] = dict(base)
        self._count = 0

    def name(self, prefix: str) -> str:
        """A fresh identifier for a constant, a nested function or a comprehension variable."""
        self._count += 1
        return f"{prefix}{self._count}"

    def const(self, value: Any) -> str:
        """Bind ``value`` in the namespace and return the name the code uses for it."""
        ident = self.name("_k")
        self.namespace[ident] = value
        return ident
