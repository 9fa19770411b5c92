"""The worker's own Prometheus metrics, in a registry the caller can inject."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class WorkerMetrics:
    """Counters the agent updates; exposed on /metrics by the worker command."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.samples = Counter("vigil_worker_samples", "valid samples consumed", registry=r)
        self.deadletters = Counter("vigil_worker_deadletters", "messages dead-lettered",
                                   ["reason"], registry=r)
        self.late = Counter("vigil_worker_late_samples",
                            "samples too late for their window", registry=r)
        self.detections = Counter("vigil_worker_detections", "detections published",
                                  ["kind", "state"], registry=r)
        self.errors = Counter("vigil_worker_batch_errors", "batches that raised", registry=r)
        self.jobs = Gauge("vigil_worker_jobs", "jobs whose engine this worker holds", registry=r)
