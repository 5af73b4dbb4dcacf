"""What the processor's step spends on a command when each aggregate gets one (the large key
spaces of bench/processor.py), part by part, in one process and without services or a profiler.

    python bench/step_parts.py                      # 20,000 aggregates, one deposit each
    python bench/step_parts.py --aggregates 100000 --repeat 5

``AggregateStep.apply`` is timed over one deposit per aggregate (states given decoded, as the
worker's cache gives them); then each part it calls is timed alone over the same inputs, in the
order apply runs them, each part's output feeding the next; the grouping of the records and the
state record's encoding (both in the task's thread, around the step) come last. The best of
``--repeat`` rounds, CPU microseconds per command. ``glue`` is apply minus its parts: the
step's own code between them.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import encode_all  # noqa: E402
from processor import EXAMPLE, deposits  # noqa: E402

from cqrs.domain.decision import CommandInput, decide  # noqa: E402
from cqrs.envelope import event_to_kafka  # noqa: E402
from cqrs.processor.partition import group_by_aggregate  # noqa: E402
from cqrs.processor.step import AggregateStep, _Pending  # noqa: E402
from cqrs.results import seen_command  # noqa: E402
from cqrs.topics import topics_for  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aggregates", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds per part (the best is shown)")
    args = ap.parse_args(argv)
    n, repeat = args.aggregates, args.repeat
    app = EXAMPLE.app
    codec = app.codec
    step = AggregateStep(app, codec, topics_for(app.name, "bench-parts-"), results_partitions=4)
    opened = encode_all(app, [(f"{EXAMPLE.prefix}{a}", EXAMPLE.open(f"{EXAMPLE.prefix}{a}", a))
                              for a in range(n)], codec)
    messages = [(e.key, e.value, e.headers, i) for i, e in enumerate(opened)]
    states = {k: step.apply(k[0], k[1], None, r) for k, r in group_by_aggregate("c", 0, messages).items()}
    work = encode_all(app, deposits(n, n), codec)
    messages = [(e.key, e.value, e.headers, i) for i, e in enumerate(work)]
    items = [(k, r, states[k]) for k, r in group_by_aggregate("c", 0, messages).items()]
    entry = app.model.entry(items[0][0][0])
    window, most = step.dedup.window_ms, step.dedup.max_per_aggregate
    encode = codec.encode

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(repeat):
            started = time.process_time()
            fn()
            times.append(time.process_time() - started)
        return min(times) / n * 1e6

    parts: list[tuple[str, float]] = []

    def part(label: str, fn: Callable[[], list[Any]]) -> list[Any]:
        parts.append((label, best(fn)))
        return fn()

    gc.disable()  # as in a slice
    apply_us = best(lambda: [step.apply(k[0], k[1], s.record, r, s.state) for k, r, s in items])
    commands = part("decode the command", lambda: [codec.decode(r[0].payload) for _, r, _ in items])
    inputs = part("CommandInput", lambda: [
        [CommandInput(r[0].envelope.command_id, c, r[0].envelope.expected_version,
                      r[0].envelope.timestamp, r[0].envelope.correlation_id)]
        for (_, r, _), c in zip(items, commands)])
    decisions = part("decide (the handler and its event)", lambda: [
        decide(entry, k[1], s.state, s.record.version, i, app.model.route)
        for (k, _, s), i in zip(items, inputs)])
    events = [d.outcomes[0].events[0] for d in decisions]
    part("encode the event, its record", lambda: [event_to_kafka(e, encode(e.event)) for e in events])
    pending = [_Pending(r[0], r[0].envelope, c) for (_, r, _), c in zip(items, commands)]
    results = part("the CommandResult", lambda: [
        step._result(p, k[0], k[1], d.outcomes[0]) for p, (k, _, _), d in zip(pending, items, decisions)])
    encoded = part("encode the result", lambda: [encode(x) for x in results])
    part("the result's record", lambda: [step._result_record(x, b, p.envelope)
                                         for x, b, p in zip(results, encoded, pending)])
    seen = part("the dedup entry", lambda: [seen_command(x, b) for x, b in zip(results, encoded)])
    snapshots = part("encode the aggregate", lambda: [encode(d.state) for d in decisions])
    records = part("the state record (dedup memory)", lambda: [
        s.record.remember(d.version, False, snap, [one], window, most)
        for (_, _, s), d, snap, one in zip(items, decisions, snapshots, seen)])
    inside = sum(us for _, us in parts)
    outside_start = len(parts)
    part("group and read the command records", lambda: list(group_by_aggregate("c", 0, messages).items()))
    part("encode the state record", lambda: [step.dump_state(x) for x in records])
    gc.enable()

    print(f"{n:,} aggregates, one deposit each; CPU us per command, best of {repeat}")
    print(f"  AggregateStep.apply                     {apply_us:6.2f}")
    for label, us in parts[:outside_start]:
        print(f"    {label:<38}{us:6.2f}")
    print(f"    {'glue (apply minus the above)':<38}{apply_us - inside:6.2f}")
    print("  around the step, in the task's thread")
    for label, us in parts[outside_start:]:
        print(f"    {label:<38}{us:6.2f}")


if __name__ == "__main__":
    main()
