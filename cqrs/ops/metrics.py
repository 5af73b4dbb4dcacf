"""The status JSON as Prometheus metrics: one collector turns a snapshot into metric families,
so ``/metrics`` and ``/status.json`` can never disagree. Exposition by ``prometheus_client``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["COUNTERS", "StatusCollector", "metrics_text"]

Snapshot = Callable[[], dict[str, Any]]

# the app's own counters in the status JSON -> (metric name, extra labels, help)
COUNTERS: dict[str, tuple[str, dict[str, str], str]] = {
    "commands_in": ("cqrs_commands_in", {},
                    "Commands the processor read from the commands topic."),
    "commands_skipped": ("cqrs_commands_skipped", {},
                         "Commands found applied already (a re-run batch)."),
    "accepted": ("cqrs_command_results", {"status": "accepted"},
                 "Command results written, by status (read from the results topic)."),
    "rejected": ("cqrs_command_results", {"status": "rejected"}, ""),
    "failed": ("cqrs_command_results", {"status": "failed"}, ""),
    "duplicates": ("cqrs_commands_answered_again", {},
                   "Commands whose id was seen before, answered with their first result again "
                   "(a client's retried send, a process manager's replay); not in "
                   "cqrs_command_results."),
    "events_out": ("cqrs_events_out", {}, "Events appended to the events topic."),
    "records_out": ("cqrs_processor_records_out", {},
                    "Records the processor wrote: events, results and dead letters."),
    "dead_letters_written": ("cqrs_dead_letters_written", {"stage": "processor"},
                             "Records written to a dead-letter topic, by stage."),
    "letters_recorded": ("cqrs_retrier_letters_recorded", {},
                         "Dead letters the retry job read and recorded."),
    "letters_parked": ("cqrs_retrier_letters_parked", {},
                       "Dead letters given up on (out of attempts, or not transient)."),
    "retries_delivered": ("cqrs_retrier_retries_delivered", {},
                          "Commands the retry job delivered again."),
    "reactions": ("cqrs_process_manager_reactions", {},
                  "Events process managers reacted to."),
    "reaction_commands": ("cqrs_process_manager_commands", {},
                          "Commands process managers sent."),
    "reaction_failures": ("cqrs_process_manager_failures", {},
                          "Events whose reaction failed (dead-lettered)."),
    "conversations_ended": ("cqrs_conversations_ended", {},
                            "Conversation outcomes process managers recorded."),
    "deadlines_scheduled": ("cqrs_deadlines_scheduled", {},
                            "Deadlines the processor's decisions scheduled (or moved)."),
    "deadlines_cancelled": ("cqrs_deadlines_cancelled", {},
                            "Deadlines the processor's decisions cancelled."),
    "deadlines_fired": ("cqrs_deadlines_fired", {},
                        "Due deadlines whose command the scheduler sent."),
    "deadlines_dropped": ("cqrs_deadlines_dropped", {},
                          "Due entries of deadlines cancelled or moved since, dropped unfired."),
    "deadline_lateness_s": ("cqrs_deadline_lateness_seconds", {},
                            "Due time to sending, summed over fired deadlines (divide by "
                            "cqrs_deadlines_fired for the mean)."),
    "history_rows": ("cqrs_history_rows_written", {},
                     "Events the history job wrote to the history table (again after a restart "
                     "or a replay)."),
    "decisions_set_aside": ("cqrs_decisions_set_aside", {},
                            "Aggregates set aside in a lane of their own because a decision of "
                            "theirs ran past [processor] slow_decision_s."),
    "decisions_timed_out": ("cqrs_decisions_timed_out", {},
                            "Commands answered failed because their decision ran past [processor] "
                            "decision_budget_s."),
    "reaction_cpu_s": ("cqrs_process_manager_cpu_seconds", {},
                       "CPU seconds the process managers' reacting threads spent (decoding, "
                       "reacting, encoding; librdkafka's own threads not counted)."),
}

PROCESSOR_PHASES = ("read_s", "step_s", "produce_s", "write_s", "cpu_s")


def metrics_text(snapshot: Snapshot) -> bytes:
    """The Prometheus text exposition of a status snapshot."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(snapshot))
    return generate_latest(registry)  # type: ignore[no-any-return]


class StatusCollector:
    """A ``prometheus_client`` collector over a status snapshot function."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        s = self.snapshot()
        app = s["app"]

        counters: dict[str, Any] = {}
        for key, (name, labels, doc) in COUNTERS.items():
            family = counters.get(name)
            if family is None:
                family = counters[name] = CounterMetricFamily(
                    name, doc or name, labels=["app", *labels])
            family.add_metric([app, *labels.values()], float(s["counters"].get(key, 0)))
        dead = counters["cqrs_dead_letters_written"]
        projected = CounterMetricFamily("cqrs_projector_events", "Events a projector read, by "
                                        "projection.", labels=["app", "projection"])
        applied = CounterMetricFamily("cqrs_projector_events_applied", "Events a projector folded "
                                      "into its read model.", labels=["app", "projection"])
        for projection, c in sorted(s.get("projector_counters", {}).items()):
            projected.add_metric([app, projection], float(c.get("events", 0)))
            applied.add_metric([app, projection], float(c.get("applied", 0)))
            dead.add_metric([app, f"projector:{projection}"], float(c.get("dead_letters", 0)))
        yield from counters.values()
        yield projected
        yield applied

        phases = CounterMetricFamily(
            "cqrs_processor_phase_seconds", "Task time of the processor's slices by phase "
            "(read state, run handlers, produce, write state; cpu: worker CPU).",
            labels=["app", "phase"])
        for phase in PROCESSOR_PHASES:
            phases.add_metric([app, phase.removesuffix("_s")], float(s["counters"].get(phase, 0.0)))
        yield phases

        up = GaugeMetricFamily("cqrs_query_up", "1 when the streaming query is active.",
                               labels=["app", "query", "kind"])
        restarts = CounterMetricFamily("cqrs_query_restarts", "Restarts after a failure.",
                                       labels=["app", "query"])
        batches = CounterMetricFamily("cqrs_query_input_rows", "Rows read by the query.",
                                      labels=["app", "query"])
        in_rate = GaugeMetricFamily("cqrs_query_input_rows_per_second",
                                    "Input rate of the last micro-batch.", labels=["app", "query"])
        proc_rate = GaugeMetricFamily("cqrs_query_processed_rows_per_second",
                                      "Processing rate of the last micro-batch.",
                                      labels=["app", "query"])
        duration = HistogramMetricFamily("cqrs_batch_duration_seconds",
                                         "Micro-batch duration (Spark's triggerExecution).",
                                         labels=["app", "query"])
        phase_total = CounterMetricFamily("cqrs_batch_phase_seconds", "Micro-batch time by "
                                          "Spark phase (durationMs), summed.",
                                          labels=["app", "query", "phase"])
        lag = GaugeMetricFamily("cqrs_query_lag_records", "Records in the input topic behind "
                                "the query's last batch, per partition.",
                                labels=["app", "query", "topic", "partition"])
        for q in s["queries"]:
            name = q["name"]
            up.add_metric([app, name, q["kind"]], 1.0 if q["state"] == "active" else 0.0)
            restarts.add_metric([app, name], float(q["restarts"]))
            batches.add_metric([app, name], float(q["input_rows"]))
            in_rate.add_metric([app, name], float(q["input_rate"]))
            proc_rate.add_metric([app, name], float(q["processing_rate"]))
            bd = q["batch_duration"]
            duration.add_metric([app, name], [(str(b), float(n)) for b, n in bd["buckets"]]
                                + [("+Inf", float(bd["count"]))], float(bd["sum_s"]))
            for phase, total in sorted(q["phase_totals_s"].items()):
                phase_total.add_metric([app, name, phase], float(total))
            for p, n in q["lag"].items():
                lag.add_metric([app, name, q["input_topic"], p], float(n))
        yield from (up, restarts, batches, in_rate, proc_rate, duration, phase_total, lag)

        ends = GaugeMetricFamily("cqrs_topic_end_offset", "End offset of a topic partition.",
                                 labels=["app", "topic", "partition"])
        for topic, parts in s["topics"].items():
            for p, end in parts.items():
                ends.add_metric([app, topic, p], float(end))
        yield ends

        waiting = GaugeMetricFamily("cqrs_dead_letters_waiting", "Records in a dead-letter "
                                    "topic (nothing deletes them: replayed ones stay counted).",
                                    labels=["app", "topic", "stage"])
        for d in s["dead_letters"]:
            waiting.add_metric([app, d["topic"], d["stage"]], float(d["waiting"]))
        yield waiting

        position = GaugeMetricFamily("cqrs_projection_position", "Next events-topic offset a "
                                     "projection generation reads, per partition.",
                                     labels=["app", "projection", "generation", "role", "partition"])
        plag = GaugeMetricFamily("cqrs_projection_lag_records", "Events a projection generation "
                                 "has still to apply.",
                                 labels=["app", "projection", "generation", "role"])
        progress = GaugeMetricFamily("cqrs_projection_rebuild_progress_ratio", "Share of the "
                                     "events topic a building generation has applied (0-1).",
                                     labels=["app", "projection", "generation"])
        for pr in s["projections"]:
            for g in pr["generations"]:
                labels = [app, pr["name"], str(g["generation"]), g["role"]]
                for p, pos in g["positions"].items():
                    position.add_metric([*labels, p], float(pos))
                plag.add_metric(labels, float(g["total_lag"]))
                if g["role"] == "building":
                    progress.add_metric(labels[:3], float(g["progress"]))
        yield from (position, plag, progress)

        waiting = GaugeMetricFamily("cqrs_deadlines_waiting", "Deadlines' due entries not reached "
                                    "yet (a cancelled or moved deadline's entry counts until its "
                                    "time), from the scheduler's per-bucket counts.",
                                    labels=["app"])
        if "deadlines_waiting" in s.get("gauges", {}):
            waiting.add_metric([app], s["gauges"]["deadlines_waiting"])
        yield waiting

        long = s.get("running_long") or {}
        lanes = GaugeMetricFamily("cqrs_decisions_running_long", "Aggregates the processor has set "
                                  "aside (a decision of theirs running long), at its last batch.",
                                  labels=["app"])
        lanes.add_metric([app], float(long.get("aggregates") or 0))
        longest = GaugeMetricFamily("cqrs_longest_decision_seconds", "How long the longest "
                                    "decision running at the processor's last batch had run.",
                                    labels=["app"])
        longest.add_metric([app], float(long.get("seconds") or 0.0))
        yield from (lanes, longest)

        rss = GaugeMetricFamily("cqrs_resident_memory_bytes", "Resident memory of the runner's "
                                "processes (driver JVM, Python driver, Python workers).",
                                labels=["app", "process"])
        for process, n in sorted(s["memory"].items()):
            rss.add_metric([app, process], float(n))
        yield rss
        start = GaugeMetricFamily("cqrs_start_seconds", "Seconds from the runner's start until "
                                  "every query was active / ready (past initialising its "
                                  "sources).",
                                  labels=["app", "until"])
        for until, secs in sorted(s["start"].items()):
            if secs is not None:
                start.add_metric([app, until], float(secs))
        yield start
