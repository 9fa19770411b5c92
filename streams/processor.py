"""What the worker does with each batch of samples and on each rebalance, apart from
Faust, so that the order of its effects can be tested without Kafka.

Per batch: decode each admitted message (a bad one goes to the dead-letter outlet
with its reason; a bad reading in a good one is dropped and counted, not the
sample), with ``identity.verify`` check its proof against the node it names
(``contracts.identity``: ``unsigned``, ``unknown_key`` or ``bad_signature`` are
dead-lettered the same way), fold each job's samples into its engine in event-time order,
advance event time, send the detections, and only then checkpoint the engine (when it
published something, or every ``worker.checkpoint_steps`` evaluated steps): a crash
can repeat a detection but never lose one. On revocation: checkpoint every live
engine, drop them, then flush the producer and commit what was processed, in that
order, so the next owner never starts ahead of the checkpoints.

``streams.app`` wires it to Faust: the topics are the outlets, the changelogged table
holds the checkpoints.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from vigil_gpu_monitor.contracts.codec import DroppedReading, encode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.identity import verifier_from
from vigil_gpu_monitor.contracts.messages import Detection, JobStatus, Sample, WorkerStatus
from vigil_gpu_monitor.contracts.status import HEAT_METRICS, job_status, worker_status
from vigil_gpu_monitor.detectors.engine import JobEngine, NodeMoves
from vigil_gpu_monitor.streams.deadletter import deadletter_record
from vigil_gpu_monitor.streams.decode import decode_sample_fast
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.state_codec import decode_state, encode_state

SOURCE_OFFSETS = "source_offsets"  # checkpoint key: partition → next offset folded in


class Message(Protocol):
    """Where a delivered sample came from (Faust's ``event.message``)."""

    key: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: float | None
    headers: Any  # (name, bytes) pairs: the node's proof (contracts.identity)


class Delivered(Protocol):
    """One delivered sample (Faust's ``EventT``): its raw value and its message."""

    value: bytes
    message: Message


class Outlets(Protocol):
    """Where the processor's output goes (Faust topics in the worker)."""

    async def detection(self, key: bytes, value: bytes, headers: dict[str, bytes]) -> None: ...

    async def deadletter(self, key: bytes | None, value: bytes) -> None: ...


class BatchProcessor:
    """One worker's live engines and the bookkeeping around them."""

    def __init__(self, cfg: Config, metrics: WorkerMetrics, outlets: Outlets,
                 checkpoints: MutableMapping[bytes, Any], worker_id: str) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.outlets = outlets
        self.checkpoints = checkpoints
        self.worker_id = worker_id
        # which worker produced a detection, for operators and tests (a header: the
        # body stays exactly the contract's message)
        self.origin = {"vigil-worker": worker_id.encode()}
        self.live: dict[str, JobEngine] = {}
        self.since_checkpoint: dict[str, int] = {}  # evaluated steps since the last one
        self.heat_due: set[str] = set()  # jobs evaluated since the last status message
        self.samples = 0
        self.deadletters = 0
        self.readings_dropped = 0
        self.moves = NodeMoves()  # a node reporting under another job left its old one
        # job → partition → the next offset its engine has folded in (kept in its
        # checkpoint): a sample below it was in the engine's state already
        self.folded: dict[str, dict[int, int]] = {}
        # partition → job → the first offset folded in since the job's last checkpoint
        self.unsaved: dict[int, dict[str, int]] = defaultdict(dict)
        self.last_batch: dict[str, float] = {}  # job → when its last batch ended (monotonic)
        self.in_batch: str | None = None  # the job whose batch is being handled
        # identity.verify: a sample must prove it comes from the node it names
        keys = cfg.identity.master_keys
        self.verifier = verifier_from(cfg.identity.verify, keys.reveal() if keys else "")

    def route(self, sample: Sample, msg: Message) -> str:
        """The key of the engine a sample of a job goes to: its job (stage 1 of a
        sharded job keys by job and shard, ``streams/stage1.py``)."""
        return sample["job"]

    def engine_for(self, job: str) -> JobEngine:
        """The job's live engine, recovered from its last checkpoint when not live."""
        engine = self.live.get(job)
        if engine is None:
            state = decode_state(self.checkpoints.get(job.encode()))
            engine = self.live[job] = JobEngine(job, self.cfg.detect, state)
            self.folded[job] = {int(p): int(o) for p, o in
                                ((state or {}).get(SOURCE_OFFSETS) or {}).items()}
            self.metrics.jobs.set(len(self.live))
        return engine

    def checkpoint(self, engine: JobEngine) -> None:
        """Write the engine's state, with the offsets it has folded in, to the
        checkpoint store; the commit may then pass them."""
        state = engine.to_state()
        state[SOURCE_OFFSETS] = {str(p): o for p, o in self.folded.get(engine.job, {}).items()}
        blob = encode_state(state)
        self.metrics.checkpoint_bytes.observe(len(blob))
        self.checkpoints[engine.job.encode()] = blob
        for jobs in self.unsaved.values():
            jobs.pop(engine.job, None)

    def checkpoint_quiet(self, quiet_seconds: float, now: float | None = None) -> int:
        """Checkpoint every engine holding samples no checkpoint has, whose job has
        had no batch for ``quiet_seconds``: a job that stops sending would otherwise
        hold the commit back (``commit_floor``) until it sends again. Never one whose
        batch is under way (its detections are sent before its checkpoint). Returns
        how many were written."""
        now = time.monotonic() if now is None else now
        waiting = {job for jobs in self.unsaved.values() for job in jobs}
        written = 0
        for job in sorted(waiting):
            engine = self.live.get(job)
            if (engine is not None and job != self.in_batch
                    and now - self.last_batch.get(job, now) >= quiet_seconds):
                self.checkpoint(engine)
                self.since_checkpoint[job] = 0
                written += 1
        return written

    def commit_floor(self, partition: int) -> int | None:
        """The lowest offset of ``partition`` some engine folded in but has not
        checkpointed (None: none): commits stop there, so a crash loses no sample
        from any job's state (``streams.offsets.OffsetGuard.floor``)."""
        jobs = self.unsaved.get(partition)
        return min(jobs.values()) if jobs else None

    async def handle(self, admitted: list[Delivered]) -> None:
        """One batch of samples the offset guard admitted, in partition order."""
        by_job: dict[str, list[tuple[Sample, int, int]]] = defaultdict(list)
        moved: list[tuple[str, str]] = []  # (old job, node) of nodes that changed jobs
        newest_append = 0.0
        good = 0
        dropped: list[DroppedReading] = []  # one bad reading costs that reading only
        for event in admitted:
            msg = event.message
            newest_append = max(newest_append, msg.timestamp or 0.0)
            mark = len(dropped)
            try:
                sample = decode_sample_fast(event.value, dropped)
                if self.verifier is not None:  # before detection: unproven is refused
                    self.verifier.check(sample["node"], event.value, msg.headers)
                key = self.route(sample, msg) if sample["job"] else ""
            except ContractError as exc:
                del dropped[mark:]  # a refused sample's readings are not counted
                self.metrics.deadletters.labels(exc.reason).inc()
                self.deadletters += 1
                await self.outlets.deadletter(msg.key, deadletter_record(
                    event.value, exc.reason, exc.detail, msg.topic, msg.partition, msg.offset))
                continue
            good += 1
            left = self.moves.left(sample)
            if left is not None:
                moved.append((left, sample["node"]))
            if key:
                self.engine_for(key)  # its folded offsets come with it
                if msg.offset < self.folded[key].get(msg.partition, -1):
                    continue  # in the engine's checkpointed state already
                by_job[key].append((sample, msg.partition, msg.offset))
        self.metrics.samples.inc(good)  # once a batch: a counter's lock costs per call
        for (metric, reason), count in Counter((d.metric, d.reason) for d in dropped).items():
            self.metrics.readings_dropped.labels(metric, reason).inc(count)
        self.readings_dropped += len(dropped)
        self.samples += good
        for job, job_samples in by_job.items():
            await self._job_batch(job, job_samples, newest_append)
        for job, node in moved:  # after the old job's samples of this batch
            if job in self.live:
                self.live[job].node_left(node)

    async def _job_batch(self, job: str, samples: list[tuple[Sample, int, int]],
                         newest_append: float) -> None:
        engine = self.engine_for(job)
        self.in_batch = job
        try:
            await self._fold(job, engine, samples, newest_append)
        finally:
            self.in_batch = None
            self.last_batch[job] = time.monotonic()

    async def _fold(self, job: str, engine: JobEngine, samples: list[tuple[Sample, int, int]],
                    newest_append: float) -> None:
        folded = self.folded[job]
        late_before, step_before = engine.late, engine.next_bin
        found: list[Detection] = []
        # in arrival order, each sample followed by the steps it closes, exactly as
        # ``vigil replay`` does: what the engine decides must not depend on where a
        # batch happened to end (a restarted worker's batches end elsewhere)
        for sample, partition, offset in samples:
            found.extend(engine.ingest(sample))
            found.extend(engine.advance())
            folded[partition] = offset + 1
            self.unsaved[partition].setdefault(job, offset)
        self.metrics.late.inc(engine.late - late_before)
        for det in found:
            self.metrics.detections.labels(det["kind"], det["state"]).inc()
            if newest_append:
                self.metrics.latency.observe(max(0.0, time.time() - newest_append))
            await self.outlets.detection(job.encode(), encode_detection(det), self.origin)
        steps = (engine.next_bin or 0) - (step_before or 0)
        if steps:
            self.heat_due.add(job)
        due = self.since_checkpoint.get(job, 0) + steps
        if found or due >= self.cfg.worker.checkpoint_steps:  # after the sends, never before
            self.checkpoint(engine)
            due = 0
        self.since_checkpoint[job] = due

    async def on_revoked(self, flush: Callable[[], Awaitable[None]],
                         commit_processed: Callable[[], Awaitable[None]]) -> None:
        """Partitions are being handed over: checkpoint and drop every engine, then
        flush the checkpoints to the changelog, then commit what was processed."""
        for engine in self.live.values():
            self.checkpoint(engine)
        self.live.clear()
        self.metrics.jobs.set(0)
        await flush()
        await commit_processed()

    def status_messages(self, now: float,
                        lag: dict[str, int]) -> list[JobStatus | WorkerStatus]:
        """The heat of each job evaluated since the last call, and this worker's
        heartbeat, for the status feed (`vigil top`)."""
        out: list[JobStatus | WorkerStatus] = []
        for job in sorted(self.heat_due):
            engine = self.live.get(job)
            if engine is not None:
                out.append(job_status(job, (engine.next_bin or 0) * self.cfg.detect.bin_seconds,
                                      self.worker_id, engine.heat(HEAT_METRICS), engine.late))
        self.heat_due.clear()
        out.append(worker_status(self.worker_id, now, dict(lag), self.samples,
                                 self.deadletters, len(self.live)))
        return out
