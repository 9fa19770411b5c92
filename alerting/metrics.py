"""The alerter's own Prometheus metrics, read from its counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from alerting.cost import goodput

if TYPE_CHECKING:
    from alerting.service import Alerter


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


def alerter_registry(alerter: Alerter) -> CollectorRegistry:
    """A registry holding only the alerter's metrics."""
    registry = CollectorRegistry()
    registry.register(AlerterCollector(alerter))
    return registry


def serve_metrics(alerter: Alerter, port: int, bind: str) -> None:
    """Serve /metrics from a daemon thread."""
    start_http_server(port, addr=bind, registry=alerter_registry(alerter))
