"""``GET /metrics``: the controller's state in the Prometheus text format, for operators.

A collector (``prometheus_client``) reads the controller at each scrape: the latest step and its
time, tokens/s, the active generation and its configuration, the phase, events by kind and
outcome, switch (downtime) and prepare-time histograms, lost steps, and every node with its slots
and liveness. Nothing is counted twice: the figures are the controller's own records.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Iterator


try:  # (a GPU image without it: the job runs, /metrics says what is missing)
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
except ImportError:  # pragma: no cover - the project's own environment has it
    CollectorRegistry = None

if TYPE_CHECKING:
    from liver.controller.controller import Controller

# seconds: a live switch is tens of milliseconds to a second, a restart tens of seconds
DOWNTIME_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
DELIVERY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PREPARE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _histogram(name: str, doc: str, values: list[float], buckets: tuple[float, ...]) -> HistogramMetricFamily:
    h = HistogramMetricFamily(name, doc)
    counts = [(str(b), sum(v <= b for v in values)) for b in buckets] + [("+Inf", len(values))]
    h.add_metric([], counts, sum_value=sum(values))
    return h


class Metrics:
    def __init__(self, ctl: "Controller") -> None:
        self.ctl = ctl
        self.registry = None
        if CollectorRegistry is not None:
            self.registry = CollectorRegistry(auto_describe=False)
            self.registry.register(self)

    def exposition(self) -> tuple[str, bytes]:
        if self.registry is None:
            return "text/plain; charset=utf-8", b"# /metrics needs the prometheus-client package (pip install prometheus-client)\n"
        return CONTENT_TYPE_LATEST, generate_latest(self.registry)

    def collect(self) -> Iterator[Any]:
        c = self.ctl.state
        p = c.progress
        g = GaugeMetricFamily("liver_step", "the latest step the active generation finished")
        g.add_metric([], p.step if p else 0)
        yield g
        g = GaugeMetricFamily("liver_step_seconds", "the latest step's time")
        g.add_metric([], p.step_s if p else 0.0)
        yield g
        g = GaugeMetricFamily("liver_tokens_per_second", "training throughput at the latest step")
        g.add_metric([], p.tokens_per_s if p else 0.0)
        yield g
        g = GaugeMetricFamily("liver_generation", "the active generation's id")
        g.add_metric([], c.active.generation if c.active else -1)
        yield g
        info = GaugeMetricFamily("liver_generation_info", "the active generation's configuration",
                                 labels=["generation", "tp", "pp", "dp", "ranks"])
        if c.active:
            par = c.active.parallel
            info.add_metric([str(c.active.generation), str(par.tp), str(par.pp), str(par.dp), str(par.world_size)], 1)
        yield info
        ph = GaugeMetricFamily("liver_phase", "the controller's phase (1 for the current one)", labels=["phase"])
        ph.add_metric([c.phase.value], 1)
        yield ph
        q = GaugeMetricFamily("liver_events_queued", "events waiting to be handled")
        q.add_metric([], len(c.queue))
        yield q
        ck = GaugeMetricFamily("liver_checkpoint_step", "the newest checkpoint published whole (-1: none stands)")
        ck.add_metric([], p.checkpoint_step if p and p.checkpoint_step is not None else -1)
        yield ck
        ck = GaugeMetricFamily("liver_checkpoint_failures_in_a_row", "periodic checkpoints failed since the last good one")
        ck.add_metric([], p.checkpoint_failures if p else 0)
        yield ck
        ck = CounterMetricFamily("liver_checkpoint_failures", "periodic checkpoints that failed")
        ck.add_metric([], self.ctl.watch.failures_total)
        yield ck

        records = list(c.records)
        ev = CounterMetricFamily("liver_events", "events handled, by kind and outcome", labels=["kind", "outcome"])
        counts: dict[tuple[str, str], int] = {}
        for r in records:
            key = (r.event.get("kind", "?"), r.outcome.value)
            counts[key] = counts.get(key, 0) + 1
        for (kind, out), n in sorted(counts.items()):
            ev.add_metric([kind, out], n)
        yield ev
        yield _histogram("liver_downtime_seconds", "training paused by a live switch (switch_s)",
                         [r["switch_s"] for r in records if "switch_s" in r], DOWNTIME_BUCKETS)
        yield _histogram("liver_prepare_seconds", "a handoff's preparation beside training (prepare_s)",
                         [r["prepare_s"] for r in records if "prepare_s" in r], PREPARE_BUCKETS)
        lost = CounterMetricFamily("liver_lost_steps", "steps trained again after fail-stops")
        lost.add_metric([], sum(r.get("lost_steps") or 0 for r in records))
        yield lost

        nodes = list(self.ctl.nodes.nodes.values())
        now = time.time()
        up = GaugeMetricFamily("liver_node_up", "1 while a node is in the job (0: lost)", labels=["node"])
        slots = GaugeMetricFamily("liver_node_slots", "a node's worker slots", labels=["node"])
        busy = GaugeMetricFamily("liver_node_processes", "a node's live worker processes", labels=["node"])
        seen = GaugeMetricFamily("liver_node_last_seen_seconds", "seconds since a node agent's last sync or standing wait",
                                 labels=["node"])
        for n in nodes:
            up.add_metric([n.name], 0 if n.lost else 1)
            slots.add_metric([n.name], n.slots)
            busy.add_metric([n.name], sum(w.returncode is None for w in list(n.workers.values())))
            seen.add_metric([n.name], max(0.0, now - getattr(n, "last_heard", now)))
        agents = GaugeMetricFamily("liver_agents", "node agents up")
        agents.add_metric([], sum(not n.lost for n in nodes))
        yield from (agents, up, slots, busy, seen)
        yield _histogram("liver_command_delivery_seconds", "a command to a node agent, from queued to taken by its "
                         "sync (the newest of each node's)",
                         [d for n in nodes for d in list(getattr(n, "delivery_s", ()))], DELIVERY_BUCKETS)
