"""Stage 2 of a sharded job's detection (docs/sharding.md): ``vigil.summary/1`` in,
``vigil.detection/1`` out.

Keyed by job: each job's ``JobStage2`` takes its shards' summaries (a part it has is
ignored: stage 1 sends again what it sent after its last checkpoint), sends the health
findings they carry through the incident tracker at once, and evaluates each bin, in
order, once every shard has summarised it: the assembled bin is exactly one stage's
sealed bin, and the evaluation is one stage's. A summary that fails the contract is
dead-lettered with its reason and counted, never a crash.

The bookkeeping is the one-stage worker's (``streams.processor.BatchProcessor``): the
offset guard on the summaries topic, checkpoints of each job's stage 2 to its
changelogged table after it publishes (and every ``worker.checkpoint_steps`` bins),
commits never past a summary some checkpoint lacks.

After a batch, each job's clock and watermark go back to its stage-1 shards when a
bin was evaluated or the watermark moved a bin (``vigil.jobclock/1`` on the compacted
``vigil.jobclock``, keyed by job; ``JobStage2.jobclock_due``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.jobclock import encode_jobclock
from vigil_gpu_monitor.contracts.messages import Detection, JobStatus, Summary, WorkerStatus
from vigil_gpu_monitor.contracts.status import HEAT_METRICS, job_status, worker_status
from vigil_gpu_monitor.contracts.summary import decode_summary
from vigil_gpu_monitor.detectors.shard import JobStage2
from vigil_gpu_monitor.streams.collector import collector_paused
from vigil_gpu_monitor.streams.deadletter import deadletter_record
from vigil_gpu_monitor.streams.decode import parse_json_fast
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import (
    SOURCE_OFFSETS,
    BatchProcessor,
    Delivered,
    Message,
    Outlets,
)
from vigil_gpu_monitor.streams.state_codec import decode_state


class Stage2Processor(BatchProcessor):
    """One stage-2 worker's live jobs and the one-stage worker's bookkeeping."""

    def __init__(self, cfg: Config, metrics: WorkerMetrics, outlets: Outlets,
                 checkpoints: MutableMapping[bytes, Any], worker_id: str,
                 send_jobclock: Callable[[bytes, bytes], Awaitable[None]] | None = None
                 ) -> None:
        super().__init__(cfg, metrics, outlets, checkpoints, worker_id)
        self.send_jobclock = send_jobclock  # (key, value) to vigil.jobclock; None: not fed back
        self.jobclocks_sent = 0
        self.shards_of: dict[str, int] = {}
        self.summaries_topic = topics.topic(topics.SUMMARIES, cfg.kafka.topic_prefix)

    def engine_for(self, job: str) -> JobStage2:  # type: ignore[override]
        """The job's live stage 2, recovered from its last checkpoint when not live."""
        stage: Any = self.live.get(job)
        if stage is None:
            state = decode_state(self.checkpoints.get(job.encode())) or {}
            shards = int(state.get("shards") or self.shards_of.get(job, 1))
            stage = JobStage2(job, shards, self.cfg.detect, state.get("stage2"))
            self.live[job] = stage
            self.folded[job] = {(False, int(p)): int(o) for p, o in
                                (state.get(SOURCE_OFFSETS) or {}).items()}
            self.metrics.jobs.set(len(self.live))
        assert isinstance(stage, JobStage2)
        return stage

    def checkpoint(self, engine: Any) -> None:
        """The job's stage 2 with the summary offsets it has folded in."""
        state = {"stage2": engine.to_state(), "shards": engine.shards,
                 SOURCE_OFFSETS: {str(p): o for (steps, p), o
                                  in self.folded.get(engine.job, {}).items() if not steps}}
        self.store_checkpoint(engine.job, state)

    async def _refuse_summary(self, msg: Message, raw: bytes, exc: ContractError) -> None:
        self.metrics.deadletters.labels(exc.reason).inc()
        self.deadletters += 1
        await self.outlets.deadletter(msg.key, deadletter_record(
            raw, exc.reason, exc.detail, msg.topic, msg.partition, msg.offset))

    async def handle(self, admitted: list[Delivered]) -> None:
        """One batch of summaries the offset guard admitted, in partition order; the
        cyclic collector waits for its end (``streams/collector.py``)."""
        with collector_paused():
            await self._handle_summaries(admitted)

    async def _handle_summaries(self, admitted: list[Delivered]) -> None:
        by_job: dict[str, list[tuple[Summary, int, int, bytes]]] = defaultdict(list)
        newest_append = 0.0
        for event in admitted:
            msg = event.message
            newest_append = max(newest_append, msg.timestamp or 0.0)
            try:
                summary = decode_summary(event.value, parse_json_fast)
            except ContractError as exc:
                await self._refuse_summary(msg, event.value, exc)
                continue
            job = summary["job"]
            self.shards_of.setdefault(job, summary["shards"])
            self.engine_for(job)
            if msg.offset < self.folded[job].get((False, msg.partition), -1):
                continue  # in the checkpointed state already
            by_job[job].append((summary, msg.partition, msg.offset, event.value))
        self.samples += sum(len(v) for v in by_job.values())
        for job, summaries in by_job.items():
            stage = self.engine_for(job)
            self.in_batch = job
            try:
                await self._summaries(job, stage, summaries, newest_append)
            finally:
                self.in_batch = None
                self.last_batch[job] = time.monotonic()

    async def _summaries(self, job: str, stage: JobStage2,
                         summaries: list[tuple[Summary, int, int, bytes]],
                         newest_append: float) -> None:
        folded = self.folded[job]
        step_before = stage.engine.next_bin
        found: list[Detection] = []
        for summary, partition, offset, raw in summaries:
            try:
                found.extend(stage.receive(summary))
            except ContractError as exc:  # another job's layout: nothing of it is used
                await self._refuse_summary(_At(partition, offset, job), raw, exc)
            found.extend(stage.evaluate_ready())
            folded[(False, partition)] = offset + 1
            self.unsaved[(self.summaries_topic, partition)].setdefault(job, offset)
        clock = stage.jobclock_due()
        if clock is not None and self.send_jobclock is not None:
            await self.send_jobclock(job.encode(), encode_jobclock(clock))
            self.jobclocks_sent += 1
        await self.send_and_checkpoint(job, stage, found, (stage.engine.next_bin or 0)
                                       - (step_before or 0), newest_append)
        if stage.engine.next_bin is not None and stage.engine.next_bin != step_before:
            self.metrics.evaluated.set(stage.engine.next_bin * self.cfg.detect.bin_seconds)

    def status_messages(self, now: float,
                        lag: dict[str, int]) -> list[JobStatus | WorkerStatus]:
        """The heat of each job evaluated since the last call, and the heartbeat."""
        out: list[JobStatus | WorkerStatus] = []
        for job in sorted(self.heat_due):
            stage: Any = self.live.get(job)
            if stage is not None:
                e = stage.engine
                out.append(job_status(job, (e.next_bin or 0) * self.cfg.detect.bin_seconds,
                                      self.worker_id, e.heat(HEAT_METRICS), e.late))
        self.heat_due.clear()
        out.append(worker_status(self.worker_id, now, dict(lag), self.samples,
                                 self.deadletters, len(self.live)))
        return out


class _At:
    """Where a summary came from, for its dead letter."""

    def __init__(self, partition: int, offset: int, job: str) -> None:
        self.key: bytes | None = job.encode()
        self.topic = "summaries"
        self.partition = partition
        self.offset = offset
        self.timestamp: float | None = None
        self.headers: Any = ()
