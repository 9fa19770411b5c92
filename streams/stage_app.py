"""The Faust apps of a sharded job's two stages (docs/sharding.md): ``vigil worker
--stage 1`` (samples → summaries) and ``--stage 2`` (summaries → detections).

Each is the one-stage app's wiring (``streams.app``) around another processor and
input: the same Faust settings, batch agent with concurrency 1, offset guard on its
input topic, changelogged table of checkpoints (memory store, rebuilt from the
compacted changelog at start), revocation order, quiet checkpoints, lag and status
timers. Each stage has its own app id (``worker.app_id`` + ``-stage1``/``-stage2``):
its own consumer group and tables, so the stages scale apart (stage 1 up to the
samples partitions, stage 2 up to the summaries partitions). Stage 2 sends each job's
clock back on ``vigil.jobclock``; every stage-1 worker reads that topic whole
(``streams/jobclock.py``) and seals what a job's watermark closed every second.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import faust
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from faust.types import TP

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.streams.app import (
    CHANGELOG_MAX_BYTES,
    _FaustOutlets,
    faust_app,
    kafka_credentials,
    wire_processor,
)
from vigil_gpu_monitor.streams.caught_up import CaughtUp
from vigil_gpu_monitor.streams.continuity import Continuity
from vigil_gpu_monitor.streams.jobclock import read_jobclocks
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import BatchProcessor
from vigil_gpu_monitor.streams.stage1 import Stage1Processor
from vigil_gpu_monitor.streams.stage2 import Stage2Processor
from vigil_gpu_monitor.streams.timers import guarded_timer

JOBCLOCK_SEAL_SECONDS = 1.0  # how often stage 1 seals what the jobs' watermarks closed


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
    app = faust_app(cfg, stage_app_id(cfg, stage),
                    os.path.join(cfg.worker.data_dir, f"stage{stage}"), partitions,
                    replication_factor)
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
        stage1 = Stage1Processor(cfg, metrics, _Stage1Outlets(summaries, deadletter),
                                 table, worker_id)
        processor = stage1
        jobclock_name = topics.topic(topics.JOBCLOCK, prefix)

        @app.task
        async def read_jobclock() -> None:
            """Every job's clock from stage 2, the whole topic (no consumer group)."""
            auth = dict(credentials_to_aiokafka_auth(kafka_credentials(cfg)))
            await read_jobclocks(stage1.jobclocks, jobclock_name, cfg.kafka_bootstrap, auth)
    else:
        detections = app.topic(topics.topic(topics.DETECTIONS, prefix), key_serializer="raw",
                               value_serializer="raw",
                               partitions=cfg.kafka.detections_partitions)
        jobclock = app.topic(topics.topic(topics.JOBCLOCK, prefix), key_serializer="raw",
                             value_serializer="raw", partitions=cfg.kafka.summaries_partitions)

        async def send_jobclock(key: bytes, value: bytes) -> None:
            await jobclock.send(key=key, value=value)

        processor = Stage2Processor(cfg, metrics, _FaustOutlets(detections, deadletter),
                                    table, worker_id, send_jobclock)
    continuity = wire_processor(app, cfg, metrics, processor, source, (inbound_name,),
                                status, f"stage {stage}: ")
    if isinstance(processor, Stage1Processor):
        _seal_quiet_shards(app, processor, continuity, inbound_name, metrics)
    return app


def _seal_quiet_shards(app: faust.App, stage1: Stage1Processor, continuity: Continuity,
                       samples: str, metrics: WorkerMetrics) -> None:
    """Stage 1's timer: note how far each assigned partition was wholly handled
    (``streams/caught_up.py``), bring back the shards a restart left stalling their
    job, and seal every quiet shard by its job's watermark."""
    caught_up = CaughtUp()

    async def _on_assigned(sender: Any, *args: Any, **kwargs: Any) -> None:
        caught_up.reset()

    app.on_partitions_assigned.connect(_on_assigned)  # type: ignore[arg-type]

    @guarded_timer(app, JOBCLOCK_SEAL_SECONDS, metrics, "stage 1: sealing by the jobs' clocks")
    async def seal_by_jobclock() -> None:
        now = time.monotonic()
        assigned = [tp for tp in app.consumer.assignment() if tp.topic == samples]
        for tp in assigned:
            handled = stage1.handled.get((tp.topic, tp.partition))
            if handled is None:  # nothing since the assignment: where it was anchored
                handled = continuity.guard.untouched_at(TP(tp.topic, tp.partition))
            caught_up.note(tp.partition, app.consumer.highwater(tp), handled, now)
        await stage1.revive_stalling({tp.partition for tp in assigned},
                                     caught_up.handled_as_of, now)
        await stage1.seal_by_jobclock(now, caught_up.handled_as_of)
