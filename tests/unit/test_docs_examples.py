"""Every ```python block of docs/*.md and README.md runs (one namespace per file, in order).

- a plain block runs here, without services;
- a ```python live block needs the real stack: ``test_live_doc_examples_run`` (marked
  ``integration``) runs the whole file, live blocks included, in a fresh process (one for all
  such files, each in a namespace of its own) with command processors running for the apps
  the docs use (``cqrs.testing.example_app:app`` and ``domain_examples.bank:app``) on topics
  and checkpoints of its own. A page's live blocks define what they use (``cfg =
  load_config()`` first), so they run as copied.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.S | re.M)
DOC_FILES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]
LIVE_APPS = ("cqrs.testing.example_app:app", "domain_examples.bank:app")


def _blocks(path: Path, *, live: bool) -> list[tuple[int, str]]:
    """``(line, code)`` of the file's python blocks; the live ones only when ``live``."""
    text = path.read_text(encoding="utf-8")
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2))
        for m in BLOCK.finditer(text)
        if live or "live" not in m.group(1).split()
    ]


def _has_live_blocks(path: Path) -> bool:
    return any("live" in m.group(1).split() for m in BLOCK.finditer(path.read_text(encoding="utf-8")))


def test_docs_have_python_examples() -> None:
    assert sum(len(_blocks(p, live=False)) for p in DOC_FILES) >= 4


def test_every_python_block_runs_somewhere() -> None:
    # no block is skipped: each runs offline here, or live against the stack
    markers = {m.group(1).strip() for p in DOC_FILES for m in BLOCK.finditer(p.read_text())}
    assert markers <= {"", "live"}


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_doc_examples_run(path: Path) -> None:
    # a real module, so classes defined in the examples resolve their type hints
    module = types.ModuleType(f"docs_example_{path.stem.replace('-', '_')}")
    sys.modules[module.__name__] = module
    try:
        for line, code in _blocks(path, live=False):
            exec(compile(code, f"{path}:{line}", "exec"), module.__dict__)  # noqa: S102
    finally:
        del sys.modules[module.__name__]


# The live pages, one after the other in one process, each in a namespace (module) of its own
# as if it ran alone: they pay for one Python start-up, one import of the framework and one Spark
# JVM (a page's spark.stop() ends its SparkContext; the next page's session starts on the same
# JVM), as tests/integration/bench_driver.py does for the bench scripts. A failing page is named
# by its traceback (``<page>:<line>``).
_RUNNER = """
import json, sys, types
for n, (path, blocks) in enumerate(json.load(sys.stdin)):
    module = types.ModuleType(f"docs_live_{n}")
    sys.modules[module.__name__] = module
    for line, code in blocks:
        exec(compile(code, f"{path}:{line}", "exec"), module.__dict__)
    print("ran", len(blocks), "blocks of", path, flush=True)
"""


@pytest.mark.integration
def test_live_doc_examples_run(cqrs_config: Any, spark: Any, unique_name: str, tmp_path: Path) -> None:
    from cqrs.processor.job import checkpoint_for, start_processor
    from cqrs.processor.workers import ProcessorOptions
    from cqrs.loading import load_app

    prefix = unique_name + "."
    cfg = cqrs_config.with_overrides(kafka={"topic_prefix": prefix},
                                     spark={"checkpoint_dir": str(tmp_path)})
    env = {**os.environ, "CQRS_KAFKA_TOPIC_PREFIX": prefix, "CQRS_SPARK_CHECKPOINT_DIR": str(tmp_path),
           "CQRS_KAFKA_BOOTSTRAP": cfg.kafka.bootstrap_servers}
    queries = [start_processor(spark, cfg, ProcessorOptions(
        ref, checkpoint=checkpoint_for(cfg, load_app(ref).name))) for ref in LIVE_APPS]
    try:
        # client.md before operations.md: the latter reads the state the former wrote
        pages = sorted((p for p in DOC_FILES if _has_live_blocks(p)),
                       key=lambda p: (p.name != "client.md", p.name))
        assert pages, "no live examples found"
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER],
            input=json.dumps([(str(path), _blocks(path, live=True)) for path in pages]),
            capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
        assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        assert done.stdout.count("ran ") == len(pages), done.stdout[-3000:]
    finally:
        for q in queries:
            q.stop()
