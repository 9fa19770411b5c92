"""The worker's own Prometheus metrics, in a registry the caller can inject."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class WorkerMetrics:
    """Counters the agent updates; exposed on /metrics by the worker command."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.samples = Counter("vigil_worker_samples", "valid samples consumed", registry=r)
        self.deadletters = Counter("vigil_worker_deadletters", "messages dead-lettered",
                                   ["reason"], registry=r)
        self.readings_dropped = Counter(
            "vigil_worker_readings_dropped",
            "readings taken out of an otherwise valid sample (the rest is kept)",
            ["metric", "reason"], registry=r)
        self.late = Counter("vigil_worker_late_samples",
                            "samples too late for their window", registry=r)
        self.detections = Counter("vigil_worker_detections", "detections published",
                                  ["kind", "state"], registry=r)
        self.offsets = Counter(
            "vigil_worker_offset_events",
            "sample offsets not handed to the detectors as delivered: replayed (seen before), "
            "gap (earlier ones missing), unanchored, refetch (seeks back over a gap), "
            "lost_to_retention", ["outcome"], registry=r)
        self.step_batches = Counter("vigil_worker_step_batches",
                                    "valid step-timing batches (vigil.step/1) consumed", registry=r)
        self.step_records = Counter("vigil_worker_step_records",
                                    "step records in the valid step batches consumed", registry=r)
        self.step_batches_refused = Counter(
            "vigil_worker_step_batches_refused",
            "step batches dead-lettered (also in vigil_worker_deadletters)", ["reason"],
            registry=r)
        self.step_records_dropped = Counter(
            "vigil_worker_step_records_dropped",
            "step records taken out of an otherwise valid batch (the rest is kept)",
            ["reason"], registry=r)
        self.late_steps = Counter("vigil_worker_late_steps",
                                  "step records too late for their window", registry=r)
        self.held = Gauge("vigil_worker_align_waiting",
                          "samples and step batches waiting for the job's other topic to "
                          "catch up in event time", registry=r)
        self.align_forced = Counter(
            "vigil_worker_align_forced",
            "messages folded without waiting longer for the other topic: quiet (it is "
            "silent), full (too many waiting)",
            ["reason"], registry=r)
        self.errors = Counter("vigil_worker_batch_errors", "batches that raised", registry=r)
        self.jobs = Gauge("vigil_worker_jobs", "job windows this worker holds", registry=r)
        self.evaluated = Gauge(
            "vigil_worker_evaluated_until_seconds",
            "event time up to which the last job this worker evaluated has its bins "
            "evaluated and their detections sent (stage 2; for lag measurements)",
            registry=r)
        self.lag = Gauge("vigil_worker_lag_messages", "samples not yet consumed",
                         ["partition"], registry=r)
        self.latency = Histogram(
            "vigil_worker_detection_latency_seconds",
            "wall time from the triggering sample's append to Kafka to the detection's send",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=r)
        self.checkpoint_bytes = Histogram(
            "vigil_worker_checkpoint_bytes", "compressed engine checkpoint size",
            buckets=(1e4, 1e5, 1e6, 4e6, 16e6, 32e6), registry=r)
