"""The alerter's own Prometheus metrics, read from its counters at scrape time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from vigil_gpu_monitor.alerting.cost import goodput
from vigil_gpu_monitor.alerting.goodput import goodput_metrics
from vigil_gpu_monitor.alerting.repair import NOT_IN_SERVICE, REPAIR_BUCKETS, gpu_hours

if TYPE_CHECKING:
    from vigil_gpu_monitor.alerting.service import Alerter


class AlerterCollector(Collector):
    """Exposes an ``Alerter``'s totals; nothing is counted twice in two places."""

    def __init__(self, alerter: Alerter) -> None:
        self.alerter = alerter

    def collect(self) -> Iterator[Metric]:
        a = self.alerter
        for name, doc, value in (
                ("vigil_alerter_detections_applied", "detections applied to Redis", a.applied),
                ("vigil_alerter_detections_duplicate",
                 "detections Redis already held (redeliveries, replays)", a.duplicates),
                ("vigil_alerter_messages_invalid", "detections or statuses that failed "
                 "validation", a.invalid),
                ("vigil_alerter_statuses", "pipeline statuses kept for the live view",
                 a.statuses),
                ("vigil_alerter_redis_errors", "Redis calls that failed (outage mode)",
                 a.outage.errors)):
            yield CounterMetricFamily(name, doc, value=value)
        deliveries = CounterMetricFamily("vigil_alerter_deliveries",
                                         "channel delivery outcomes", labels=["channel", "result"])
        for (channel, result), count in sorted(a.outcomes.items()):
            deliveries.add_metric([channel, result], count)
        yield deliveries
        pending = GaugeMetricFamily("vigil_alerter_channel_pending",
                                    "notifications queued for a channel", labels=["channel"])
        for channel, worker in sorted(a.workers.items()):
            pending.add_metric([channel], worker.pending())
        yield pending
        yield GaugeMetricFamily("vigil_alerter_open_incidents", "incidents firing now",
                                value=len(a.router.open))
        yield from cost_metrics(a)
        yield from goodput_metrics(a.goodput)
        yield from repair_metrics(a)
        yield GaugeMetricFamily("vigil_alerter_redis_backlog",
                                "detections delivered but not yet written to Redis",
                                value=len(a.outage.backlog))


def cost_metrics(a: Alerter) -> Iterator[Metric]:
    """GPU-hours lost (a counter by job and kind), the rate lost now, and the fleet's
    goodput: the share of the GPU time of the jobs Vigil watches not lost to open
    incidents (job sizes from the worker's status feed, else from the detections)."""
    lost = CounterMetricFamily("vigil_gpu_hours_lost", "GPU-hours lost to incidents "
                               "(estimated from the detections' cost)", labels=["job", "kind"])
    for (job, kind), hours in sorted(a.ledger.totals().items()):
        lost.add_metric([job, kind], hours)
    yield lost
    losing = a.ledger.losing_now()
    gpus = dict(a.job_gpus)
    for inc in a.ledger.open.values():
        gpus[inc.job] = max(gpus.get(inc.job, 0), inc.gpus)
    lost_now = sum(min(rate, gpus[job]) for job, rate in losing.items())
    yield GaugeMetricFamily("vigil_gpu_hours_lost_per_hour",
                            "GPU-hours per hour lost to the open incidents now", value=lost_now)
    yield GaugeMetricFamily("vigil_fleet_goodput", "share of the watched jobs' GPU time "
                            "not lost to open incidents (1 = none lost)",
                            value=goodput(sum(gpus.values()), lost_now))


def repair_metrics(a: Alerter) -> Iterator[Metric]:
    """The repair loop, read from Redis at scrape time (so every alerter replica says the
    same): nodes out by state, how long each has been out, GPU-hours held out, and the
    time from out to returned. Empty when Redis does not answer."""
    by_state = GaugeMetricFamily("vigil_nodes_out", "nodes Vigil holds out of service, "
                                 "by repair state", labels=["state"])
    ages = GaugeMetricFamily("vigil_node_out_seconds", "how long each node Vigil holds out "
                             "has been out", labels=["node", "state"])
    held = GaugeMetricFamily("vigil_gpu_hours_held_out", "GPU-hours the nodes out now have "
                             "been out (their GPUs × time out)")
    returned = CounterMetricFamily("vigil_node_gpu_hours_returned", "GPU-hours nodes were "
                                   "held out before Vigil returned them")
    repair = getattr(getattr(a, "remediator", None), "repair", None)
    out: dict[str, dict[str, str]] = {}
    stats: dict[str, float] = {}
    if repair is not None:
        try:
            out, stats = repair.log.out_nodes(), repair.log.stats()
        except redis.RedisError:
            pass
    now = time.time()
    for state in NOT_IN_SERVICE:
        by_state.add_metric([state], sum(r["state"] == state for r in out.values()))
    for node, record in sorted(out.items()):
        ages.add_metric([node, record["state"]], now - float(record.get("out_at") or now))
    held.add_metric([], sum(gpu_hours(r, now) for r in out.values()))
    returned.add_metric([], stats.get("gpu_hours_returned", 0.0))
    buckets = [(f"{b:g}", stats.get(f"le:{b:g}", 0.0)) for b in REPAIR_BUCKETS]
    buckets.append(("+Inf", stats.get("count", 0.0)))
    yield from (by_state, ages, held, returned)
    yield HistogramMetricFamily("vigil_node_repair_seconds", "time from a node taken out "
                                "to its return after a passed verification",
                                buckets=buckets, sum_value=stats.get("sum", 0.0))


def alerter_registry(alerter: Alerter) -> CollectorRegistry:
    """A registry holding only the alerter's metrics."""
    registry = CollectorRegistry()
    registry.register(AlerterCollector(alerter))
    return registry


def serve_metrics(alerter: Alerter, port: int, bind: str) -> None:
    """Serve /metrics from a daemon thread."""
    start_http_server(port, addr=bind, registry=alerter_registry(alerter))
