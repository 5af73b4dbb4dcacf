"""``cqrs top <module:app>``: the status page's figures in the terminal, refreshed in place
(plain ANSI escapes, no curses). Reads what ``cqrs serve`` reads: Kafka, the stores and the
app runner's ``/status.json`` ([metrics] runner_url, else host:port)."""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from collections.abc import Sequence
from typing import Any

from cqrs.config import CqrsConfig

__all__ = ["register", "render_top", "sparkline"]

BLOCKS = "▁▂▃▄▅▆▇█"
CLEAR = "\x1b[H\x1b[2J"
BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"
STATE_COLOURS = {"active": "\x1b[32m", "starting": "\x1b[33m", "restarting": "\x1b[33m",
                 "failed": "\x1b[31m", "stopped": "\x1b[31m", "refused": "\x1b[31m"}
COUNTERS = (("commands_in", "commands in"), ("accepted", "accepted"), ("rejected", "rejected"),
            ("failed", "failed"), ("events_out", "events out"),
            ("commands_skipped", "already applied"), ("dead_letters_written", "dead letters"))


def register(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    top = commands.add_parser("top", help="an app's queries, rates, lag, dead letters and "
                              "projections in the terminal, refreshing")
    top.add_argument("app", help="the App, as module:attribute (e.g. domain_examples.bank:app)")
    top.add_argument("--interval", type=float, default=2.0, metavar="S",
                     help="seconds between refreshes (default: 2)")
    top.add_argument("--once", action="store_true", help="print once, without colours, and exit")
    top.set_defaults(run=_run_top)


def sparkline(values: Sequence[float], width: int = 24) -> str:
    """``values`` (the last ``width``) as block characters scaled to their maximum."""
    tail = list(values)[-width:]
    top = max(tail, default=0.0)
    if top <= 0:
        return BLOCKS[0] * len(tail)
    return "".join(BLOCKS[min(len(BLOCKS) - 1, int(v / top * (len(BLOCKS) - 1) + 0.5))]
                   for v in tail)


def _n(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def render_top(s: dict[str, Any], *, colour: bool = True) -> str:
    """The screen for one status snapshot."""
    def c(code: str, text: str) -> str:
        return f"{code}{text}{RESET}" if colour else text

    when = _dt.datetime.fromtimestamp(s["time"]).strftime("%H:%M:%S")
    lines = [c(BOLD, f"cqrs top: {s['app']}") + f"   {when}   source: {s['source']}"]
    runner = s.get("runner")
    if runner and not runner["reachable"]:
        lines.append(c(DIM, f"runner: {runner['error']}"))
    start = s.get("start") or {}
    if start.get("all_ready_s") is not None:
        lines.append(c(DIM, f"every query was ready {start['all_ready_s']:.1f} s after the "
                            "runner started"))
    lines += ["", c(BOLD, f"{'query':<28} {'state':<11} {'gen':>3} {'restarts':>8} {'batches':>8} "
                          f"{'in/s':>9} {'done/s':>9} {'lag':>8} {'batch s':>8}  processed/s")]
    for q in s["queries"]:
        state = q["state"]
        batch = q["phases_ms"].get("triggerExecution")
        history = [h[2] for h in q["history"]]
        lines.append(
            f"{q['name'][:28]:<28} {c(STATE_COLOURS.get(state, ''), f'{state:<11}')} "
            f"{_n(q['generation']):>3} {q['restarts']:>8} {q['batches']:>8} "
            f"{_n(q['input_rate']):>9} {_n(q['processing_rate']):>9} {_n(q['total_lag']):>8} "
            f"{_n(batch / 1000 if batch is not None else None, 2):>8}  {sparkline(history)}")
        if q.get("last_error") and state != "active":
            lines.append(c(DIM, f"    {q['last_error'].splitlines()[0][:100]}"))
    if not s["queries"]:
        lines.append(c(DIM, "no queries known (is `cqrs run app` running?)"))
    counters = s.get("counters") or {}
    lines += ["", "  ".join(f"{label}: {c(BOLD, _n(counters.get(key, 0)))}"
                            for key, label in COUNTERS)]
    waiting = (s.get("gauges") or {}).get("deadlines_waiting")
    fired = counters.get("deadlines_fired", 0)
    if waiting is not None or fired or counters.get("deadlines_scheduled"):
        late = counters.get("deadline_lateness_s", 0) / fired if fired else None
        lines.append(f"deadlines: waiting {c(BOLD, _n(waiting))}  scheduled "
                     f"{_n(counters.get('deadlines_scheduled', 0))}  cancelled "
                     f"{_n(counters.get('deadlines_cancelled', 0))}  fired {_n(fired)}  "
                     f"mean lateness {_n(late, 2)} s")
    long = s.get("running_long")
    if long:
        lines.append(c(STATE_COLOURS["failed"], f"running long: {long['aggregates']} aggregate(s) set aside; longest "
                            f"{long['longest']} for {_n(long['seconds'], 1)} s"))
    if s["dead_letters"]:
        lines.append("dead letters waiting: " + "  ".join(
            f"{d['stage']} {_n(d['waiting'])}" for d in s["dead_letters"]))
    if s["projections"]:
        lines += ["", c(BOLD, f"{'projection':<28} {'gen':>3} {'role':<9} {'lag':>8} progress")]
        for p in s["projections"]:
            for g in p["generations"]:
                bar = "#" * int(g["progress"] * 20)
                lines.append(f"{p['name'][:28]:<28} {g['generation']:>3} {g['role']:<9} "
                             f"{_n(g['total_lag']):>8} [{bar:<20}] {g['progress']:.0%}")
    if s.get("memory"):
        lines += ["", "memory: " + "  ".join(f"{k} {v / 2**20:,.0f} MiB"
                                           for k, v in sorted(s["memory"].items()))]
    return "\n".join(lines) + "\n"


def _run_top(cfg: CqrsConfig, args: argparse.Namespace) -> int:
    from cqrs.http.status import ServeStatus
    from cqrs.loading import load_app

    app = load_app(args.app)
    probes = []
    if app.projections:
        from projections.status_probe import ProjectionProbe  # the CLI sees both sides

        probes.append(ProjectionProbe.for_app)
    status = ServeStatus(app, cfg, probes)
    try:
        while True:
            screen = render_top(status.snapshot(), colour=not args.once)
            if args.once:
                sys.stdout.write(screen)
                return 0
            sys.stdout.write(CLEAR + screen)
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        status.close()
