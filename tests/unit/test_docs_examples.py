"""Every ```python block of docs/*.md and README.md runs (one namespace per file, in order).

Mark a block ```python no-run to skip it (sparingly).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)


def _blocks(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in BLOCK.finditer(text)
        if "no-run" not in m.group(1)
    ]


DOC_FILES = [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]


def test_docs_have_python_examples() -> None:
    assert sum(len(_blocks(p)) for p in DOC_FILES) >= 4


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_doc_examples_run(path: Path) -> None:
    # a real module, so classes defined in the examples resolve their type hints
    module = types.ModuleType(f"docs_example_{path.stem.replace('-', '_')}")
    sys.modules[module.__name__] = module
    try:
        for line, code in _blocks(path):
            exec(compile(code, f"{path}:{line}", "exec"), module.__dict__)  # noqa: S102
    finally:
        del sys.modules[module.__name__]
