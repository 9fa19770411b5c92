"""Kafka topic names. A deployment may prefix them (``kafka.topic_prefix``)."""

SAMPLES = "vigil.samples"
DETECTIONS = "vigil.detections"
DEADLETTER = "vigil.deadletter"
ALERTS = "vigil.alerts"
STEPS = "vigil.steps"  # per-rank step timings, vigil.step/1 (key = job id)
ACTIONS = "vigil.actions"
STATUS = "vigil.status"  # internal: the live view's feed (contracts/status.py)
SUMMARIES = "vigil.summaries"  # internal: stage 1 to stage 2 of sharded detection (key = job)
# internal: stage 2 back to every stage 1 worker, a sharded job's clock (key = job, compacted)
JOBCLOCK = "vigil.jobclock"


def topic(name: str, prefix: str = "") -> str:
    """The topic name as deployed: ``prefix + name``."""
    return f"{prefix}{name}"
