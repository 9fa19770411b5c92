"""What the worker does with each batch of samples and step timings and on each
rebalance, apart from Faust, so that the order of its effects can be tested without
Kafka.

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

Step timings (``vigil.step/1``, topic ``vigil.steps``, key = job) take the same path:
decoded leniently (a bad step record costs that record, counted; a bad batch is
dead-lettered with its reason; with ``identity.verify`` its proof is checked like a
sample's), then folded into the job's engine as ``vigil replay`` folds them
(``JobEngine.ingest_steps``, then ``advance``). The two topics arrive in no common
order, so each job's messages pass ``streams.align.JobAligner`` first: each kind
waits, boundedly, for the other to catch up in event time. Offsets are kept per
(topic, partition): a checkpoint records the samples' (``source_offsets``, as
before) and the steps' (``step_offsets``) it folded in, and nothing waiting in an
aligner is committed.

``streams.app`` wires it to Faust: the topics are the outlets, the changelogged table
holds the checkpoints.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import DroppedReading, encode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.identity import verifier_from
from vigil_gpu_monitor.contracts.messages import (
    Detection,
    JobStatus,
    Sample,
    StepBatch,
    WorkerStatus,
)
from vigil_gpu_monitor.contracts.status import HEAT_METRICS, job_status, worker_status
from vigil_gpu_monitor.contracts.steps import DroppedStep, decode_steps
from vigil_gpu_monitor.detectors.engine import JobEngine, NodeMoves
from vigil_gpu_monitor.streams.align import AlignParams, Held, JobAligner
from vigil_gpu_monitor.streams.collector import collector_paused
from vigil_gpu_monitor.streams.deadletter import deadletter_record
from vigil_gpu_monitor.streams.decode import decode_sample_fast
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.state_codec import decode_state, encode_state

SOURCE_OFFSETS = "source_offsets"  # checkpoint key: samples partition → next offset folded in
STEP_OFFSETS = "step_offsets"  # checkpoint key: steps partition → next offset folded in
ALIGN = "align"  # checkpoint key: the job's aligner (``streams.align``), where it has timings
TP = tuple[str, int]  # (topic, partition): how offsets are kept
Source = tuple[bool, int]  # (a steps partition, partition): a checkpoint's offsets
Item = Sample | StepBatch


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
                 checkpoints: MutableMapping[bytes, Any], worker_id: str,
                 align: AlignParams | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.outlets = outlets
        self.checkpoints = checkpoints
        self.worker_id = worker_id
        # which worker produced a detection, for operators and tests (a header: the
        # body stays exactly the contract's message)
        self.origin = {"vigil-worker": worker_id.encode()}
        self.live: dict[str, JobEngine] = {}
        self.steps_topic = topics.topic(topics.STEPS, cfg.kafka.topic_prefix)
        self.align_params = align or AlignParams(slack=cfg.detect.grace_seconds)
        self.aligners: dict[str, JobAligner[Item]] = {}  # job → its messages waiting
        self.step_batches = 0
        self.since_checkpoint: dict[str, int] = {}  # evaluated steps since the last one
        self.heat_due: set[str] = set()  # jobs evaluated since the last status message
        self.samples = 0
        self.deadletters = 0
        self.readings_dropped = 0
        self.moves = NodeMoves()  # a node reporting under another job left its old one
        # job → (steps?, partition) → the next offset its engine has folded in (kept in
        # its checkpoint): a message below it was in the engine's state already
        self.folded: dict[str, dict[Source, int]] = {}
        # (topic, partition) → job → the first offset folded in since the job's last
        # checkpoint
        self.unsaved: dict[TP, dict[str, int]] = defaultdict(dict)
        self._lock = asyncio.Lock()  # a batch and the wait timer never fold at once
        self.last_batch: dict[str, float] = {}  # job → when its last batch ended (monotonic)
        self.in_batch: str | None = None  # the job whose batch is being handled
        # (topic, partition) → the next offset not yet handled (since the assignment)
        self.handled: dict[TP, int] = {}
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
            state = decode_state(self.checkpoints.get(job.encode())) or {}
            engine = self.live[job] = JobEngine(job, self.cfg.detect, state)
            self.folded[job] = {
                **{(False, int(p)): int(o) for p, o in (state.get(SOURCE_OFFSETS) or {}).items()},
                **{(True, int(p)): int(o) for p, o in (state.get(STEP_OFFSETS) or {}).items()}}
            # a checkpoint without the aligner's state is a samples-only job's
            self.aligners[job] = JobAligner(self.align_params, time.monotonic(),
                                            state.get(ALIGN) or ({"timed": False} if state
                                                                 else None))
            self.metrics.jobs.set(len(self.live))
        return engine

    def checkpoint(self, engine: JobEngine) -> None:
        """Write the engine's state, with the offsets it has folded in, to the
        checkpoint store; the commit may then pass them."""
        state = engine.to_state()
        folded = self.folded.get(engine.job, {})
        state[SOURCE_OFFSETS] = {str(p): o for (steps, p), o in folded.items() if not steps}
        step_offsets = {str(p): o for (steps, p), o in folded.items() if steps}
        aligner = self.aligners.get(engine.job)
        if step_offsets or (aligner is not None and aligner.timed):
            # only where the job sends timings: a samples-only job's checkpoint is unchanged
            state[STEP_OFFSETS] = step_offsets
            if aligner is not None:
                state[ALIGN] = aligner.to_state()
        self.store_checkpoint(engine.job, state)

    def store_checkpoint(self, job: str, state: dict[str, Any]) -> None:
        """Write ``job``'s checkpoint (the stages' too); the commit may then pass the
        offsets it holds."""
        blob = encode_state(state)
        self.metrics.checkpoint_bytes.observe(len(blob))
        self.checkpoints[job.encode()] = blob
        for jobs in self.unsaved.values():
            jobs.pop(job, None)

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

    def evict_idle(self, idle_seconds: float, now: float | None = None) -> int:
        """Drop the live engine of every job that has had no batch for
        ``idle_seconds``: a job that ended would otherwise keep its engine (its
        window and learned streams, 5-10 KB a GPU) for as long as the worker
        runs, and a worker that watches a fleet's jobs come and go would grow
        without bound. Each is checkpointed first, so nothing it folded in is lost,
        and a job that sends again comes back from that checkpoint, as it does
        after a handover (crash equals replay covers that path). Never one whose
        batch is under way, nor one with messages waiting in its aligner. Returns
        how many were dropped."""
        now = time.monotonic() if now is None else now
        idle = [job for job in self.live
                if job != self.in_batch and now - self.last_batch.get(job, now) >= idle_seconds
                and not (job in self.aligners and self.aligners[job].held)]
        for job in idle:
            self.checkpoint(self.live.pop(job))
            self.forget(job)
        if idle:
            self.metrics.jobs.set(len(self.live))
        return len(idle)

    def forget(self, job: str) -> None:
        """What the worker keeps of a job besides its engine (dropped with it)."""
        self.aligners.pop(job, None)
        self.folded.pop(job, None)
        self.since_checkpoint.pop(job, None)
        self.last_batch.pop(job, None)
        self.heat_due.discard(job)

    def commit_floor(self, tp: TP) -> int | None:
        """The lowest offset of ``tp`` (topic, partition) some engine folded in but has
        not checkpointed, or some job holds waiting for the other topic (None: none):
        commits stop there, so a crash loses no message from any job's state
        (``streams.offsets.OffsetGuard.floor``)."""
        jobs = self.unsaved.get(tp)
        floors = list(jobs.values()) if jobs else []
        for aligner in self.aligners.values():
            if aligner.held:
                held = aligner.floor(tp)
                if held is not None:
                    floors.append(held)
        return min(floors) if floors else None

    async def handle(self, admitted: list[Delivered]) -> None:
        """One batch the offset guard admitted (samples and step timings), in
        partition order. The cyclic collector waits for its end
        (``streams/collector.py``)."""
        async with self._lock:
            with collector_paused():
                await self._handle(admitted)

    async def _handle(self, admitted: list[Delivered]) -> None:
        arrived: dict[str, None] = {}  # jobs with new messages, in order of arrival
        moved: list[tuple[str, str]] = []  # (old job, node) of nodes that changed jobs
        newest_append = 0.0
        good = 0
        dropped: list[DroppedReading] = []  # one bad reading costs that reading only
        now = time.monotonic()
        for event in admitted:
            msg = event.message
            newest_append = max(newest_append, msg.timestamp or 0.0)
            if msg.topic == self.steps_topic:
                batch = await self._decode_steps(event)
                if batch is not None and self._admit(batch["job"], True, msg, batch, now):
                    arrived[batch["job"]] = None
                continue
            mark = len(dropped)
            try:
                sample = decode_sample_fast(event.value, dropped)
                if self.verifier is not None:  # before detection: unproven is refused
                    self.verifier.check(sample["node"], event.value, msg.headers)
                key = self.route(sample, msg) if sample["job"] else ""
            except ContractError as exc:
                del dropped[mark:]  # a refused sample's readings are not counted
                await self._refuse(event, exc)
                continue
            good += 1
            left = self.moves.left(sample)
            if left is not None:
                moved.append((left, sample["node"]))
            if key and self._admit(key, False, msg, sample, now):
                arrived[key] = None
        self.metrics.samples.inc(good)  # once a batch: a counter's lock costs per call
        for (metric, reason), count in Counter((d.metric, d.reason) for d in dropped).items():
            self.metrics.readings_dropped.labels(metric, reason).inc(count)
        self.readings_dropped += len(dropped)
        self.samples += good
        for job in arrived:
            await self._job_batch(job, newest_append, now)
        for job, node in moved:  # after the old job's samples of this batch
            if job in self.live:
                self.live[job].node_left(node)
        self._count_held()
        handled = self.handled
        for event in admitted:  # in partition order: the last of each is its newest
            msg = event.message
            handled[(msg.topic, msg.partition)] = msg.offset + 1

    async def _refuse(self, event: Delivered, exc: ContractError) -> None:
        """Dead-letter a message the contract refuses, with its reason; counted."""
        msg = event.message
        self.metrics.deadletters.labels(exc.reason).inc()
        self.deadletters += 1
        await self.outlets.deadletter(msg.key, deadletter_record(
            event.value, exc.reason, exc.detail, msg.topic, msg.partition, msg.offset))

    async def _decode_steps(self, event: Delivered) -> StepBatch | None:
        """A step batch, or None when refused (dead-lettered, counted). A bad step
        record costs that record only (counted by reason)."""
        dropped: list[DroppedStep] = []
        try:
            batch = decode_steps(event.value, dropped)
            if self.verifier is not None:
                self.verifier.check(batch["node"], event.value, event.message.headers)
        except ContractError as exc:
            self.metrics.step_batches_refused.labels(exc.reason).inc()
            await self._refuse(event, exc)
            return None
        for reason, count in Counter(d.reason for d in dropped).items():
            self.metrics.step_records_dropped.labels(reason).inc(count)
        self.metrics.step_batches.inc()
        self.metrics.step_records.inc(sum(len(r["steps"]) for r in batch["ranks"]))
        self.step_batches += 1
        return batch

    def _admit(self, job: str, steps: bool, msg: Message, item: Item, now: float) -> bool:
        """Hand one message to its job's aligner, unless its engine's checkpoint holds
        it already; True when it was handed over."""
        self.engine_for(job)  # its folded offsets and its aligner come with it
        if msg.offset < self.folded[job].get((steps, msg.partition), -1):
            return False  # in the engine's checkpointed state already
        tp = (msg.topic, msg.partition)
        aligner = self.aligners[job]
        if steps:
            batch: Any = item
            ends = [s["end"] for r in batch["ranks"] for s in r["steps"]]
            if not ends:  # every step record was refused: nothing to fold, nothing to wait for
                self.folded[job][(True, msg.partition)] = msg.offset + 1
                self.unsaved[tp].setdefault(job, msg.offset)
                return False
            aligner.add_steps(max(ends), tp, msg.offset, item, now)
        else:
            ts: float = item["ts"]  # type: ignore[typeddict-item]
            # how long it sat in its agent: its record's send time less its own
            aligner.add_sample(ts, tp, msg.offset, item, now,
                               msg.timestamp - ts if msg.timestamp else None)
        return True

    async def release_waiting(self, now: float | None = None) -> int:
        """Fold what has waited long enough for the other topic (``streams.align``'s
        bounds: a job whose other stream went quiet); returns how many were folded.
        Called every second by the worker."""
        now = time.monotonic() if now is None else now
        folded = 0
        async with self._lock:
            for job in [j for j, a in self.aligners.items() if a.held]:
                if job in self.live:
                    folded += await self._job_batch(job, 0.0, now)
            self._count_held()
        return folded

    def _count_held(self) -> None:
        self.metrics.held.set(sum(a.held for a in self.aligners.values()))

    async def _job_batch(self, job: str, newest_append: float, now: float) -> int:
        engine = self.engine_for(job)
        aligner = self.aligners[job]
        forced = Counter(aligner.forced)
        released = aligner.release(now)
        for reason, count in (aligner.forced - forced).items():
            self.metrics.align_forced.labels(reason).inc(count)
        if not released:
            return 0
        self.in_batch = job
        try:
            await self._fold(job, engine, released, newest_append)
        finally:
            self.in_batch = None
            self.last_batch[job] = time.monotonic()
        return len(released)

    async def _fold(self, job: str, engine: JobEngine, released: list[tuple[bool, Held[Item]]],
                    newest_append: float) -> None:
        folded = self.folded[job]
        late_before, step_before = engine.late, engine.next_bin
        steps_late = 0
        found: list[Detection] = []
        # in arrival order (the aligner's, across the two topics), each message followed
        # by the steps it closes, exactly as ``vigil replay`` does: what the engine
        # decides must not depend on where a batch happened to end (a restarted worker's
        # batches end elsewhere)
        for is_steps, held in released:
            if is_steps:
                late = engine.late
                engine.ingest_steps(held.item)  # type: ignore[arg-type]
                steps_late += engine.late - late
            else:
                found.extend(engine.ingest(held.item, held.wait))  # type: ignore[arg-type]
            found.extend(engine.advance())
            topic, partition = held.tp
            folded[(is_steps, partition)] = held.offset + 1
            self.unsaved[(topic, partition)].setdefault(job, held.offset)
        self.metrics.late.inc(engine.late - late_before - steps_late)
        self.metrics.late_steps.inc(steps_late)
        await self.send_and_checkpoint(job, engine, found, (engine.next_bin or 0)
                                       - (step_before or 0), newest_append)

    async def send_and_checkpoint(self, job: str, engine: Any, found: list[Detection],
                                  steps: int, newest_append: float) -> None:
        """Send a batch's detections, then checkpoint ``engine`` (the stages' too) if
        any went out or ``worker.checkpoint_steps`` evaluated steps are due; ``steps``:
        the bins this batch evaluated."""
        for det in found:
            self.metrics.detections.labels(det["kind"], det["state"]).inc()
            if newest_append:
                self.metrics.latency.observe(max(0.0, time.time() - newest_append))
            await self.outlets.detection(job.encode(), encode_detection(det), self.origin)
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
        # what waited in the aligners is in no checkpoint and was not committed: the
        # next owner reads it again
        self.aligners.clear()
        self.unsaved.clear()
        self.handled.clear()
        self._count_held()

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
