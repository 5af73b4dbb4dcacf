"""Runs bench scripts one after another in this one interpreter, each as ``python SCRIPT ARGS``
would run it (``runpy`` as ``__main__``, its own ``sys.argv``, its folder first on ``sys.path``).

The smoke runs of ``tests/integration/test_bench_smoke.py`` use it so that several scripts pay
for one Python start-up, one import of the framework and one Spark JVM: a script's
``spark.stop()`` ends its SparkContext, and the next script's session starts on the same JVM
(a few seconds instead of a JVM's start-up each; the CI run has little time to spare).

    python tests/integration/bench_driver.py bench/history.py --hot 5 -- bench/peers.py --json

After each script, a line ``SMOKE <script> ok|failed <seconds>``; a failed script's traceback is
printed and the next one still runs; the exit status is 1 when any failed.
"""

from __future__ import annotations

import runpy
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path


def split_runs(argv: Sequence[str]) -> list[list[str]]:
    """``SCRIPT ARGS -- SCRIPT ARGS ...`` as one list per script."""
    runs: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            runs.append([])
        else:
            runs[-1].append(arg)
    return [run for run in runs if run]


def run_script(script: str, args: Sequence[str]) -> bool:
    """``python script args`` in this process; whether it ended well (exit status 0)."""
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        return exc.code in (None, 0)
    except BaseException:  # noqa: BLE001 - printed, and the next script still runs
        traceback.print_exc()
        return False
    return True


def main(argv: Sequence[str]) -> int:
    failed = 0
    for script, *args in split_runs(argv):
        print(f"SMOKE {script} starts: {' '.join(args)}", flush=True)
        started = time.monotonic()
        ok = run_script(script, args)
        sys.stdout.flush()
        print(f"SMOKE {script} {'ok' if ok else 'failed'} {time.monotonic() - started:.1f}",
              flush=True)
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
