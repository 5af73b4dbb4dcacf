"""The fault suite uses the integration tests' helpers (``cluster_harness``, ``process_group``),
which live beside them in ``tests/integration``."""

from __future__ import annotations

import sys
from pathlib import Path

_HELPERS = str(Path(__file__).resolve().parents[1] / "integration")
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)
