"""The node agent's own metrics on its /metrics endpoint: read from the agent and its
publisher at scrape time (counters for totals, gauges for the buffer and the publish
latency). prometheus_client is imported here only, when the endpoint is served."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from vigil_gpu_monitor.producers.agent import Agent


def _quantile(publisher: Any, q: float) -> float:
    values = sorted(getattr(publisher, "latencies", ()))
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


class AgentCollector:
    """The agent's own metrics, read from the agent and publisher at scrape time:
    counters for totals, gauges for the buffer and publish latency."""

    def __init__(self, agent: Agent, publisher: Any) -> None:
        self.agent = agent
        self.publisher = publisher

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        agent, pub = self.agent, self.publisher
        sampler = agent.sampler
        for name, doc, value in (
                ("vigil_agent_ticks", "ticks run", agent.ticks),
                ("vigil_agent_values_read", "metric values read",
                 sampler.read if sampler else 0),
                ("vigil_agent_values_published", "metric values published",
                 sampler.published if sampler else 0),
                ("vigil_agent_samples_published", "samples acknowledged by Kafka",
                 getattr(pub, "published", 0)),
                ("vigil_agent_samples_dropped", "samples dropped from a full buffer",
                 getattr(pub, "dropped", 0))):
            yield CounterMetricFamily(name, doc, value=value)
        errors = CounterMetricFamily("vigil_agent_errors", "source and publish errors",
                                     labels=["kind"])
        merged: collections.Counter[str] = collections.Counter()
        for source in (agent.errors, getattr(pub, "errors", {}),
                       getattr(agent.job_of, "errors", {})):
            merged.update(source)
        for kind, count in sorted(merged.items()):
            errors.add_metric([kind], count)
        yield errors
        dropped = CounterMetricFamily(
            "vigil_agent_readings_dropped",
            "readings the contract refuses, taken out of the sample (the rest is published)",
            labels=["metric", "reason"])
        for (metric, reason), count in sorted(agent.dropped.items()):
            dropped.add_metric([metric, reason], count)
        yield dropped
        skipped = CounterMetricFamily(
            "vigil_agent_series_skipped",
            "exporter series skipped (value unparsable, DCGM blank, NaN); the page's rest is read",
            labels=["source", "field", "reason"])
        for name, source in sorted(agent.sources.items()):
            for (field, reason), count in sorted(getattr(source, "skipped", {}).items()):
                skipped.add_metric([name, field, reason], count)
        yield skipped
        yield GaugeMetricFamily("vigil_agent_samples_buffered",
                                "samples waiting for Kafka (memory, in flight, spool)",
                                value=getattr(pub, "buffered", 0))
        spool = getattr(pub, "spool", None)
        yield GaugeMetricFamily("vigil_agent_spool_bytes", "bytes in the disk spool",
                                value=spool.size_bytes if spool is not None else 0)
        for q in (0.5, 0.99):
            yield GaugeMetricFamily(
                f"vigil_agent_publish_latency_p{int(q * 100)}_seconds",
                "buffer → Kafka ack, last 10k samples", value=_quantile(pub, q))


def agent_registry(agent: Agent, publisher: Any) -> Any:
    """A Prometheus registry holding only the agent's metrics."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    registry.register(AgentCollector(agent, publisher))
    return registry
