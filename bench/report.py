"""The figures of one ``bench/processor.py`` invocation: the Markdown summary table, the JSON
file and the PNG plots (matplotlib, Agg backend).

    python bench/report.py bench/results/20261123-101500.json               # table + plots again
    python bench/report.py bench/results/20261123-101500.json --no-plot     # table only

A row is a dict: ``system`` (``cqrs`` for ours), ``kind`` (``throughput`` or ``latency``),
``aggregates``, ``commands``, and ``commands_per_s`` or ``p50_s``/``p99_s``/``max_s``
(plus ``rtt_s``, every round trip, where measured here), ``loadavg`` before the run,
``machine_pct``, ``memory`` (peak RSS in MiB) where sampled, ``error`` for a failed run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["OURS", "plot_all", "results_json", "summary_table", "write_results"]

OURS = "cqrs"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS_DIR = ROOT / "bench" / "results"
DEFAULT_IMG_DIR = ROOT / "docs" / "img"

Row = dict[str, Any]


# ---------------------------------------------------------------------------------- table

def _run_label(row: Row) -> str:
    if row["kind"] == "latency":
        return (f"{row.get('rate_per_s', 0):,.0f}/s for {row.get('seconds', 0):,.0f} s, "
                f"{row.get('aggregates') or 0:,} aggregates")
    if row["kind"] != "throughput":
        return str(row["kind"])
    aggregates = row.get("aggregates")
    stateless = row["system"].startswith("spark floor")
    over = " (stateless)" if stateless else f", {aggregates or 0:,} aggregates"
    snapshots = f", snapshots every {row['snapshot_interval']}" if row.get("snapshot_interval") else ""
    return f"{row.get('commands') or 0:,} commands{over}{snapshots}"


def _figure(row: Row) -> str:
    if row.get("error"):
        return f"failed: {row['error'][:120]}"
    if row["kind"] == "latency":
        rtt = sorted(row.get("rtt_s") or ())
        if not rtt:
            return f"**p50 {_s(row['p50_s'])}, p99 {_s(row['p99_s'])}**, max {_s(row['max_s'])}"
        return (f"**p50 {_s(row['p50_s'])}**, p90 {_s(_quantile(rtt, 0.9))}, "
                f"**p99 {_s(row['p99_s'])}**, p99.9 {_s(_quantile(rtt, 0.999))}, max {_s(row['max_s'])}")
    return f"**{row['commands_per_s']:,.0f} commands/s** ({row['seconds']:,.1f} s)"


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values (nearest rank)."""
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered))) - 1))]


def _s(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def _ours_for(row: Row, rows: Sequence[Row]) -> Row | None:
    """Our row a peer's or floor's row compares with: the same kind; for throughput the same
    number of aggregates (a stateless floor: ours at 1,000 aggregates, else the fewest)."""
    ours = [r for r in rows if r["system"] == OURS and r["kind"] == row["kind"] and not r.get("error")]
    if row["kind"] == "throughput":
        same = [r for r in ours if r.get("aggregates") == row.get("aggregates")]
        if not same and row["system"].startswith("spark floor"):
            same = sorted(ours, key=lambda r: (r.get("aggregates") != 1000, r.get("aggregates") or 0))
        ours = same
    return ours[0] if ours else None


def _ratio(row: Row, rows: Sequence[Row]) -> str:
    """The row's figure divided by ours (throughput: > 1 is faster than ours; latency: < 1 is
    faster than ours)."""
    if row["system"] == OURS:
        return "ours"
    ours = _ours_for(row, rows)
    if row.get("error") or ours is None:
        return "n/a"
    if row["kind"] == "throughput":
        return f"{row['commands_per_s'] / ours['commands_per_s']:.2f}x"
    return f"p50 {row['p50_s'] / ours['p50_s']:.2f}x, p99 {row['p99_s'] / ours['p99_s']:.2f}x"


def _memory(row: Row) -> str:
    mem = row.get("memory")
    if mem:
        return f"{mem['jvm_mib']:,.0f} / {mem['workers_mib']:,.0f} ({mem['workers']})"
    if row.get("peak_rss_mib"):
        return f"{row['peak_rss_mib']:,} (process)"
    return ""


def _load(row: Row) -> str:
    load = row.get("loadavg")
    return " / ".join(f"{x:.2f}" for x in load) if load else ""


def _table_order(row: Row) -> tuple[int, int, int]:
    """Throughput rows by aggregates, then latency rows, then failed runs of a whole peer;
    within each, ours first, then the floors and the peers."""
    kind = {"throughput": 0, "latency": 1}.get(row["kind"], 2)
    return kind, row.get("aggregates") or 0, _system_rank(row["system"])


def summary_table(rows: Sequence[Row]) -> str:
    """Every figure as one Markdown table: comparable rows next to each other, ours first."""
    header = ("| system | run | figure | vs ours | load avg before (1/5/15 min) | machine CPU % "
              "| peak RSS MiB: Spark JVM / Python workers (count) |\n"
              "| --- | --- | --- | --- | --- | --- | --- |")
    lines = [header]
    for row in sorted(rows, key=_table_order):
        cpu = row.get("machine_pct")
        lines.append(f"| {row['system']} | {_run_label(row)} | {_figure(row)} | {_ratio(row, rows)} "
                     f"| {_load(row)} | {'' if cpu is None else cpu} | {_memory(row)} |")
    return "\n".join(lines)


def write_results(meta: dict[str, Any], rows: Sequence[Row], results_dir: Path = DEFAULT_RESULTS_DIR) -> Path:
    """``<results_dir>/<timestamp>.json`` with the invocation's settings and every row."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(results_json(meta, rows))
    return path


def results_json(meta: dict[str, Any], rows: Sequence[Row]) -> str:
    """JSON with one line per setting and per row (a latency row holds every round trip:
    one number per line would make a file of tens of thousands of lines)."""
    head = [f" {json.dumps(key)}: {json.dumps(value)}," for key, value in meta.items() if key != "rows"]
    body = ",\n".join(f"  {json.dumps(row)}" for row in rows)
    return "{\n" + "\n".join(head) + '\n "rows": [\n' + body + "\n ]\n}\n"


# ---------------------------------------------------------------------------------- plots

STYLE = {  # system -> (colour, marker), in the order tables and legends list them
    OURS: ("tab:red", "o"),
    "spark floor": ("tab:gray", None),
    "spark floor + mapInArrow": ("tab:purple", None),
    "kafka streams": ("tab:green", "^"),
    "eventsourcing sqlite": ("tab:blue", "s"),
    "eventsourcing popo": ("tab:cyan", "D"),
}


def _system_rank(system: str) -> int:
    """Ours first, then the floors, then the peers (the order of STYLE)."""
    order = list(STYLE)
    return order.index(system) if system in order else len(order)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _log_axis(axis: Any, fmt: str) -> None:
    """Plain numbers on a log axis (``1,000``, ``0.5``), minor ticks labelled at 2x and 5x only."""
    import math

    from matplotlib.ticker import FuncFormatter

    def label(value: float, _pos: int) -> str:
        if value <= 0:
            return ""
        mantissa = round(value / 10 ** math.floor(math.log10(value) + 1e-9), 3)
        if mantissa not in (1, 2, 5):
            return ""
        return _compact(value) if fmt == "compact" else format(value, fmt)

    axis.set_major_formatter(FuncFormatter(label))
    axis.set_minor_formatter(FuncFormatter(label))


def _widen_to_labels(ax: Any) -> None:
    """Widen a log y range to the nearest labelled values (1, 2 or 5 times a power of ten)
    around it, so a narrow range (20,000-42,000/s) still shows numbers on its axis."""
    import math

    def steps(lo: float, hi: float) -> list[float]:
        return [m * 10 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
                for m in (1, 2, 5)]

    lo, hi = ax.get_ylim()
    marks = steps(lo, hi)
    ax.set_ylim(max(v for v in marks if v <= lo), min(v for v in marks if v >= hi))


def _compact(value: float) -> str:
    """1000 -> 1k, 1000000 -> 1M."""
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}"


def _ok(rows: Sequence[Row], kind: str) -> list[Row]:
    return [r for r in rows if r["kind"] == kind and not r.get("error")]


def plot_throughput(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """Commands/s against aggregates, log-log: a line per system; the stateless floors as
    horizontal lines (they keep no aggregate)."""
    found = _ok(rows, "throughput")
    if not found:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    systems = sorted(dict.fromkeys(r["system"] for r in found), key=_system_rank)
    for system in systems:
        colour, marker = STYLE.get(system, ("black", "x"))
        points = sorted((r["aggregates"], r["commands_per_s"]) for r in found if r["system"] == system)
        if system.startswith("spark floor"):
            for _, rate in points[-1:]:
                ax.axhline(rate, color=colour, linestyle="--", label=f"{system} (stateless): {rate:,.0f}/s")
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, color=colour, marker=marker, label=system)
        for x, y in points:
            ax.annotate(f"{y:,.0f}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _log_axis(ax.xaxis, "compact")
    _log_axis(ax.yaxis, ",.0f")
    _widen_to_labels(ax)
    ax.set_xlabel("aggregates (log)")
    ax.set_ylabel("commands/s (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def plot_latency(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """The distribution (CDF) of round trips for every run with all its round trips (ours and
    the two floors); a peer that reports only percentiles appears as its p50 and p99 points."""
    found = _ok(rows, "latency")
    if not found:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for row in sorted(found, key=lambda r: _system_rank(r["system"])):
        colour, marker = STYLE.get(row["system"], ("black", "x"))
        rtt = row.get("rtt_s")
        if rtt:
            xs = sorted(rtt)
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.plot(xs, ys, color=colour, label=f"{row['system']} (p50 {_s(row['p50_s'])}, p99 {_s(row['p99_s'])})")
        else:
            ax.plot([row["p50_s"], row["p99_s"]], [0.5, 0.99], color=colour, marker=marker or "x",
                    linestyle=":", label=f"{row['system']} (p50 and p99 only)")
    ax.set_xscale("log")
    _log_axis(ax.xaxis, "g")
    _label(ax, "round trip: produce call -> answer consumed (s, log)", "fraction of commands",
           title, loc="lower right")
    return _save(fig, plt, path)


def plot_latency_over_time(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """Each round trip of our latency runs against when its command was sent (commands go out
    at the offered rate, so the n-th was sent at n / rate): stalls show as columns."""
    found = [r for r in _ok(rows, "latency") if r["system"] == OURS and r.get("rtt_s")]
    if not found:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    for i, row in enumerate(found):
        rate = row.get("rate_per_s") or 1.0
        rtt = row["rtt_s"]
        ax.scatter([n / rate for n in range(len(rtt))], rtt, s=2, alpha=0.5,
                   label=f"run {i + 1}: p99 {_s(row['p99_s'])}, max {_s(row['max_s'])}")
    ax.set_yscale("log")
    _log_axis(ax.yaxis, "g")
    _label(ax, "command sent at (s into the run)", "round trip (s, log)", title,
           loc="upper right", markerscale=4)
    return _save(fig, plt, path)


def _label(ax: Any, xlabel: str, ylabel: str, title: str, **legend: Any) -> None:
    """Axis labels, title, grid and legend of a latency plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, **legend)


def plot_memory(rows: Sequence[Row], path: Path, title: str) -> Path | None:
    """Peak RSS of our Spark JVM and Python workers against aggregates."""
    found = sorted((r for r in _ok(rows, "throughput") if r["system"] == OURS and r.get("memory")),
                   key=lambda r: r["aggregates"])
    if not found:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [r["aggregates"] for r in found]
    lines = (("jvm_mib", "Spark JVM", "tab:red"), ("workers_mib", "Python workers (sum)", "tab:orange"),
             ("driver_mib", "bench driver (holds the encoded commands)", "tab:gray"))
    for key, label, colour in lines:
        ax.plot(xs, [r["memory"][key] for r in found], marker="o", color=colour, label=label)
    ax.set_xscale("log")
    _log_axis(ax.xaxis, "compact")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("aggregates (log)")
    ax.set_ylabel("peak RSS (MiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, plt, path)


def _save(fig: Any, plt: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_all(results: dict[str, Any], img_dir: Path = DEFAULT_IMG_DIR) -> list[Path]:
    """The PNGs of one results file: throughput, latency, latency over time, memory."""
    rows = results["rows"]
    when = results.get("started", "")[:16].replace("T", " ")
    where = results.get("machine", {}).get("summary", "")
    subtitle = f"{when}, {where}".strip(", ")
    made = [
        plot_throughput(rows, img_dir / "processor-throughput.png", f"Command throughput\n{subtitle}"),
        plot_latency(rows, img_dir / "processor-latency.png", f"Round trips at a fixed offered rate\n{subtitle}"),
        plot_latency_over_time(rows, img_dir / "processor-latency-time.png",
                               f"cqrs round trips over time at a fixed offered rate\n{subtitle}"),
        plot_memory(rows, img_dir / "processor-memory.png", f"cqrs processor: peak memory during a run\n{subtitle}"),
    ]
    return [p for p in made if p is not None]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path)
    parser.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--img-dir", type=Path, default=DEFAULT_IMG_DIR)
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    print(summary_table(results["rows"]))
    if args.plot:
        for path in plot_all(results, args.img_dir):
            print(f"plot: {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
