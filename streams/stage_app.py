"""The Faust apps of a sharded job's two stages (docs/sharding.md): ``vigil worker
--stage 1`` (samples → summaries) and ``--stage 2`` (summaries → detections).

Each is the one-stage app's wiring (``streams.app``) around another processor and
input: the same Faust settings, batch agent with concurrency 1, offset guard on its
input topic, changelogged table of checkpoints (memory store, rebuilt from the
compacted changelog at start), revocation order, quiet checkpoints, lag and status
timers. Each stage has its own app id (``worker.app_id`` + ``-stage1``/``-stage2``):
its own consumer group and tables, so the stages scale apart (stage 1 up to the
samples partitions, stage 2 up to the summaries partitions).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import faust

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.status import encode_status, feed_key
from vigil_gpu_monitor.streams.app import (
    CHANGELOG_MAX_BYTES,
    QUIET_CHECKPOINT_SECONDS,
    PerBatchMonitor,
    _FaustOutlets,
    kafka_credentials,
)
from vigil_gpu_monitor.streams.continuity import Continuity
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import BatchProcessor
from vigil_gpu_monitor.streams.stage1 import Stage1Processor
from vigil_gpu_monitor.streams.stage2 import Stage2Processor

log = logging.getLogger(__name__)


class _Stage1Outlets:
    """Stage 1's outlets: summaries keyed by job, dead letters."""

    def __init__(self, summaries: Any, deadletter: Any) -> None:
        self._summaries = summaries
        self._deadletter = deadletter

    async def summary(self, key: bytes, value: bytes) -> None:
        await self._summaries.send(key=key, value=value)

    async def deadletter(self, key: bytes | None, value: bytes) -> None:
        await self._deadletter.send(key=key, value=value)


def stage_app_id(cfg: Config, stage: int) -> str:
    """The Faust app id (and consumer group) of a stage."""
    return f"{cfg.worker.app_id}-stage{stage}"


def build_stage_app(cfg: Config, stage: int, metrics: WorkerMetrics | None = None,
                    replication_factor: int = 1) -> faust.App:
    """The Faust app of stage 1 or 2 with its topics, table, agent and timers."""
    if stage not in (1, 2):
        raise ValueError(f"stage {stage}: 1 or 2")
    metrics = metrics or WorkerMetrics()
    prefix = cfg.kafka.topic_prefix
    inbound = topics.SAMPLES if stage == 1 else topics.SUMMARIES
    partitions = (cfg.kafka.samples_partitions if stage == 1
                  else cfg.kafka.summaries_partitions)
    app = faust.App(
        stage_app_id(cfg, stage),
        broker=f"kafka://{cfg.kafka_bootstrap}",
        store="memory://",
        datadir=os.path.join(cfg.worker.data_dir, f"stage{stage}"),
        topic_partitions=partitions,
        topic_replication_factor=replication_factor,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        producer_acks=-1,
        producer_max_request_size=CHANGELOG_MAX_BYTES,
        broker_session_timeout=cfg.worker.session_timeout_seconds,
        broker_heartbeat_interval=max(0.5, cfg.worker.session_timeout_seconds / 10),
        broker_credentials=kafka_credentials(cfg),
        consumer_max_fetch_size=cfg.worker.fetch_bytes_per_partition,
        Monitor=PerBatchMonitor,
    )
    inbound_name = topics.topic(inbound, prefix)
    source = app.topic(inbound_name, key_type=bytes, value_type=bytes, key_serializer="raw",
                       value_serializer="raw", partitions=partitions)
    deadletter = app.topic(topics.topic(topics.DEADLETTER, prefix), key_serializer="raw",
                           value_serializer="raw", partitions=1)
    status = app.topic(topics.topic(topics.STATUS, prefix), key_serializer="raw",
                       value_serializer="raw", partitions=1)
    table = app.Table(f"stage{stage}", default=None, partitions=partitions,
                      key_type=bytes, value_type=bytes, use_partitioner=True,
                      extra_topic_configs={"max.message.bytes": str(CHANGELOG_MAX_BYTES)})
    worker_id = f"{socket.gethostname()}-{os.getpid()}-stage{stage}"
    processor: BatchProcessor
    if stage == 1:
        summaries = app.topic(topics.topic(topics.SUMMARIES, prefix), key_serializer="raw",
                              value_serializer="raw",
                              partitions=cfg.kafka.summaries_partitions)
        processor = Stage1Processor(cfg, metrics, _Stage1Outlets(summaries, deadletter),
                                    table, worker_id)
    else:
        detections = app.topic(topics.topic(topics.DETECTIONS, prefix), key_serializer="raw",
                               value_serializer="raw",
                               partitions=cfg.kafka.detections_partitions)
        processor = Stage2Processor(cfg, metrics, _FaustOutlets(detections, deadletter),
                                    table, worker_id)
    continuity = Continuity(app, inbound_name, metrics)
    continuity.guard.floor = processor.commit_floor  # never commit past a checkpoint
    lag_now: dict[str, int] = {}

    async def _on_revoked(sender: Any, *args: Any, **kwargs: Any) -> None:
        await processor.on_revoked(app.producer.flush, continuity.commit_processed)

    async def _on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        continuity.on_assigned()

    app.on_partitions_revoked.connect(_on_revoked)  # type: ignore[arg-type]
    app.on_partitions_assigned.connect(_on_assigned)  # type: ignore[arg-type]

    @app.agent(source, concurrency=1)
    async def process(stream: Any) -> None:
        """The stage's stream processor (a Faust agent; not the node agent)."""
        async for events in stream.take_events(cfg.worker.batch_size,
                                               within=cfg.worker.batch_seconds):
            if isinstance(app.monitor, PerBatchMonitor):
                app.monitor.on_batch_in(events)
            try:
                await processor.handle(await continuity.admit(events))
            except Exception:  # a Faust agent that raises dies silently: count, log, go on
                metrics.errors.inc()
                log.exception("stage %d: batch of %d messages failed", stage, len(events))

    @app.timer(interval=1.0)
    async def watch_offsets() -> None:
        try:
            await continuity.watch()
        except Exception as exc:
            log.warning("offset watch failed, retrying in 1 s: %r", exc)

    @app.timer(interval=1.0)
    async def checkpoint_quiet() -> None:
        processor.checkpoint_quiet(QUIET_CHECKPOINT_SECONDS)

    @app.timer(interval=5.0)
    async def report_lag() -> None:
        lag_now.clear()
        for tp in app.consumer.assignment():
            if tp.topic != inbound_name:
                continue
            high = app.consumer.highwater(tp)
            position = await app.consumer.position(tp)
            if high is not None and position is not None:
                lag_now[str(tp.partition)] = max(0, high - position)
                metrics.lag.labels(str(tp.partition)).set(lag_now[str(tp.partition)])

    if cfg.worker.status_seconds > 0:
        @app.timer(interval=cfg.worker.status_seconds)
        async def publish_status() -> None:
            for msg in processor.status_messages(time.time(), lag_now):
                await status.send(key=feed_key(msg), value=encode_status(msg))

    return app
