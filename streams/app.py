"""The Faust application: consume samples, keep per-job engines in a table, detect.

Samples are keyed by job, so one job's engine lives on one worker. The agent runs
with concurrency 1 and works in batches (Faust's per-message cost is high, and
concurrency > 1 can commit past in-flight messages). Each batch: decode (bad
messages go to the dead-letter topic with their reason), fold samples into the
job's engine, advance event time, publish detections, and write each touched
engine back to the changelogged table once.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import faust

from contracts import topics
from contracts.codec import decode_sample, encode_detection
from contracts.config import Config
from contracts.errors import ContractError
from detectors.engine import JobEngine
from streams.deadletter import deadletter_record
from streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)


def build_app(cfg: Config, metrics: WorkerMetrics | None = None) -> faust.App:
    """The configured Faust app with its topics, engine table and agent."""
    metrics = metrics or WorkerMetrics()
    prefix = cfg.kafka.topic_prefix
    app = faust.App(
        cfg.worker.app_id,
        broker=f"kafka://{cfg.kafka_bootstrap}",
        store="memory://",
        datadir=cfg.worker.data_dir,
        topic_partitions=cfg.kafka.samples_partitions,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        producer_acks=-1,
    )
    samples = app.topic(topics.topic(topics.SAMPLES, prefix), key_type=bytes, value_type=bytes,
                        key_serializer="raw", value_serializer="raw",
                        partitions=cfg.kafka.samples_partitions)
    detections = app.topic(topics.topic(topics.DETECTIONS, prefix), key_serializer="raw",
                           value_serializer="raw", partitions=cfg.kafka.detections_partitions)
    deadletter = app.topic(topics.topic(topics.DEADLETTER, prefix), key_serializer="raw",
                           value_serializer="raw", partitions=1)
    engines = app.Table("engines", default=None, partitions=cfg.kafka.samples_partitions,
                        schema=faust.Schema(key_type=bytes, key_serializer="raw",
                                            value_serializer="json"),
                        use_partitioner=True)

    @app.agent(samples, concurrency=1)
    async def process(stream: Any) -> None:
        async for events in stream.take_events(cfg.worker.batch_size,
                                               within=cfg.worker.batch_seconds):
            try:
                await _handle_batch(events)
            except Exception:  # an agent that raises dies silently: count, log, go on
                metrics.errors.inc()
                log.exception("batch of %d samples failed", len(events))

    async def _handle_batch(events: list[Any]) -> None:
        by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for event in events:
            msg = event.message
            try:
                sample = decode_sample(event.value)
            except ContractError as exc:
                metrics.deadletters.labels(exc.reason).inc()
                await deadletter.send(key=msg.key, value=deadletter_record(
                    event.value, exc.reason, exc.detail, msg.topic, msg.partition, msg.offset))
                continue
            metrics.samples.inc()
            if sample["job"]:
                by_job[sample["job"]].append(sample)
        for job, job_samples in by_job.items():
            key = job.encode()
            engine = JobEngine(job, cfg.detect, engines.get(key))
            late_before = engine.late
            found = []
            for sample in sorted(job_samples, key=lambda s: s["ts"]):
                found.extend(engine.ingest(sample))
            metrics.late.inc(engine.late - late_before)
            for det in found + engine.advance():
                metrics.detections.labels(det["kind"], det["state"]).inc()
                await detections.send(key=key, value=encode_detection(det))
            engines[key] = engine.to_state()
        metrics.jobs.set(len(engines))

    return app
