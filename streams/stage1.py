"""Stage 1 of a sharded job's detection (docs/sharding.md): a shard's samples in,
``vigil.summary/2`` out.

Agents key a sample of a job split in K shards ``job#k/K`` (``contracts/shards.py``;
a job of one shard keeps the job id as its key). Each
(job, shard) has a ``ShardEngine``: the one-stage ingest (clock, held readings, open
bins, per-sample health) for its nodes; every bin its watermark closes is sealed and
summarised, and health findings that fire on a sample are summarised at once. The
summaries go to ``vigil.summaries`` keyed by job, split in parts that fit a message.

Everything else is the one-stage worker's (``streams.processor.BatchProcessor``):
decoding, dead letters, identity checks, the offset guard, checkpoints of each
shard's state to its changelogged table every ``worker.checkpoint_steps`` bins, and
commits never past a sample some checkpoint lacks. After a crash a shard resumes
from its checkpoint and sends the summaries since again, the same ones (its state is
a function of its samples): stage 2 ignores a part it already has.

The job's clock and watermark come back from stage 2 (``vigil.jobclock/1``,
``streams/jobclock.py``): each shard takes its job's newest clock before a batch of
its samples, and a timer (``seal_by_jobclock``) seals what the job's watermark
closed in shards that have had no sample for ``grace_seconds`` (their nodes all fell
silent; stage 2 waits for every shard, so they would stall the job). Only a quiet
shard takes the job's watermark, and quiet means nothing of it waits in Kafka
(``streams/caught_up.py``): one behind, a restarted worker with a backlog, would
otherwise seal bins its samples have not reached and drop its backlog as late.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any, Protocol

import msgspec

from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import JobStatus, Sample, Summary, WorkerStatus
from vigil_gpu_monitor.contracts.shards import shard_key, shard_of, split_key
from vigil_gpu_monitor.contracts.status import worker_status
from vigil_gpu_monitor.contracts.summary import encode_summary, split_parts
from vigil_gpu_monitor.detectors.shard import ShardEngine
from vigil_gpu_monitor.streams.align import Held, JobAligner
from vigil_gpu_monitor.streams.jobclock import JobClockFeed
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import SOURCE_OFFSETS, BatchProcessor, Item, Message
from vigil_gpu_monitor.streams.state_codec import decode_state


class SummaryOutlets(Protocol):
    """Where stage 1's output goes (Faust topics in the worker)."""

    async def summary(self, key: bytes, value: bytes) -> None: ...

    async def deadletter(self, key: bytes | None, value: bytes) -> None: ...


class Stage1Processor(BatchProcessor):
    """One stage-1 worker's live shards and the one-stage worker's bookkeeping."""

    def __init__(self, cfg: Config, metrics: WorkerMetrics, outlets: SummaryOutlets,
                 checkpoints: MutableMapping[bytes, Any], worker_id: str) -> None:
        super().__init__(cfg, metrics, outlets, checkpoints, worker_id)  # type: ignore[arg-type]
        self.summary_outlets = outlets
        self.shards_of: dict[str, tuple[str, int, int]] = {}  # key → (job, shard, shards)
        self.summaries_sent = 0
        self.jobclocks = JobClockFeed()  # each job's newest clock from stage 2
        # checkpointed shards not live, as revive_stalling weighs them (read once an
        # assignment; a revived one is live, and live until the next handover)
        self._dormant: dict[str, tuple[frozenset[int], str, int, float | None]] = {}

    def route(self, sample: Sample, msg: Message) -> str:
        """The shard's key, ``job#k/K`` as the agent keyed it (``job`` alone: one
        shard). The key must name the sample's job and the shard its node falls in,
        else ``bad_key``."""
        raw = msg.key.decode(errors="replace") if msg.key else sample["job"]
        job, shard, shards = split_key(raw)
        if job != sample["job"] or shard != shard_of(sample["node"], shards):
            raise ContractError("bad_key", f"key {raw[:80]!r} does not name job "
                                f"{sample['job']!r} and the shard of node {sample['node']!r}")
        key = shard_key(job, sample["node"], shards)
        self.shards_of[key] = (job, shard, shards)
        return key

    def engine_for(self, job: str) -> ShardEngine:  # type: ignore[override]
        """The shard's live engine, recovered from its last checkpoint when not live."""
        engine: Any = self.live.get(job)
        if engine is None:
            state = decode_state(self.checkpoints.get(job.encode()))
            name, shard, shards = self.shards_of.get(job) or _unpack(state, job)
            engine = ShardEngine(name, shard, shards, self.cfg.detect,
                                 (state or {}).get("engine"))
            self.live[job] = engine
            self.folded[job] = {(False, int(p)): int(o) for p, o in
                                ((state or {}).get(SOURCE_OFFSETS) or {}).items()}
            # stage 1 reads samples alone: nothing waits for step timings
            self.aligners[job] = JobAligner(self.align_params, time.monotonic(),
                                            {"timed": False})
            self.metrics.jobs.set(len(self.live))
        assert isinstance(engine, ShardEngine)
        return engine

    def checkpoint(self, engine: Any) -> None:
        """The shard's state with the offsets it has folded in (as one stage's)."""
        state = {"engine": engine.to_state(), "job": engine.engine.job,
                 "shard": engine.shard, "shards": engine.shards,
                 SOURCE_OFFSETS: {str(p): o for (steps, p), o
                                  in self.folded.get(engine.job, {}).items() if not steps}}
        self.store_checkpoint(engine.job, state)

    async def _fold(self, job: str, engine: Any, released: list[tuple[bool, Held[Item]]],
                    newest_append: float) -> None:
        shard: ShardEngine = engine
        folded = self.folded[job]
        late_before = shard.engine.late
        self._take_jobclock(shard)
        out: list[Summary] = []
        bins = 0
        for _, held in released:  # each sample, then the bins it closes (samples only)
            out.extend(shard.ingest(held.item, held.wait))  # type: ignore[arg-type]
            sealed = shard.seal_closed()
            bins += len(sealed)
            out.extend(sealed)
            folded[(False, held.tp[1])] = held.offset + 1
            self.unsaved[held.tp].setdefault(job, held.offset)
        self.metrics.late.inc(shard.engine.late - late_before)
        await self._send(shard, out, bins)

    def _take_jobclock(self, shard: ShardEngine, watermark: bool = False) -> bool:
        """Hand the shard its job's newest clock (and watermark), if one was heard."""
        clock = self.jobclocks.get(shard.engine.job) if shard.shards > 1 else None
        if clock is None:
            return False
        shard.take_jobclock(clock, watermark)
        return True

    async def seal_by_jobclock(
            self, now: float | None = None,
            handled_as_of: Callable[[int], float | None] | None = None) -> int:
        """Seal, in every live shard quiet for ``grace_seconds``, the bins its job's
        watermark closed, and send their summaries: a shard whose nodes all fell
        silent has no sample to seal by, and would stall its job (stage 2 waits for
        every shard). Called every second by the worker; returns the bins sealed.

        ``handled_as_of(partition)``: when everything in the partition had last been
        handled (``streams/caught_up.py``). With it, a shard is quiet only when that
        moment is after its last batch: nothing of it waits in Kafka. Without it (the
        processor driven directly), a shard without a batch for a while is quiet."""
        now = time.monotonic() if now is None else now
        quiet = self.cfg.detect.grace_seconds
        sealed = 0
        async with self._lock:
            for key, engine in list(self.live.items()):
                shard: Any = engine
                last = self.last_batch.get(key, now)
                if (key == self.in_batch or now - last < quiet
                        or not self._wholly_read(key, last, handled_as_of)
                        or not self._take_jobclock(shard, watermark=True)):
                    continue
                out = shard.seal_closed()
                if out:
                    sealed += len(out)
                    await self._send(shard, out, len(out))
        return sealed

    async def revive_stalling(self, assigned: Collection[int],
                              handled_as_of: Callable[[int], float | None],
                              now: float | None = None) -> list[str]:
        """Bring back, from their checkpoints, the shards this worker owns that are
        not live though their job went on without them: after a restart a shard
        whose nodes had all fallen silent has no sample left to make it live, so the
        timer would never seal it and stage 2, which waits for every shard, would
        stall its job for good. A shard qualifies when every partition it was read
        from is assigned here and wholly handled (nothing of it waits in Kafka: a
        sample after its checkpoint would have made it live; the commit never
        passes one), and its job's watermark (``vigil.jobclock/1``) is more than
        ``grace_seconds`` and a bin past the newest sample it holds (the job's
        other shards went on: a job that simply ended is left alone). A revived
        shard is quiet from now, and sealed once it has been for ``grace_seconds``.
        Each checkpoint is read once an assignment; returns the shards revived."""
        now = time.monotonic() if now is None else now
        ahead = self.cfg.detect.grace_seconds + self.cfg.detect.bin_seconds
        revived: list[str] = []
        async with self._lock:
            for raw in list(self.checkpoints.keys()):
                key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                if key in self.live:
                    continue
                dormant = self._dormant.get(key)
                if dormant is None:
                    dormant = self._dormant[key] = _dormant_of(
                        decode_state(self.checkpoints.get(raw)), key)
                parts, job, shards, newest = dormant
                clock = self.jobclocks.get(job) if shards > 1 and parts else None
                if clock is None or clock["shards"] != shards or newest is None:
                    continue
                if not (parts <= set(assigned)
                        and all(handled_as_of(p) is not None for p in parts)):
                    continue
                if clock["max_ts"] is None or clock["max_ts"] <= newest + ahead:
                    continue
                self.engine_for(key)
                self.last_batch[key] = now
                revived.append(key)
        return revived

    def forget(self, job: str) -> None:
        """As every worker's, and a dropped shard's checkpoint is weighed afresh if
        ``revive_stalling`` looks at it (what it read of it before is older)."""
        super().forget(job)
        self._dormant.pop(job, None)

    async def on_revoked(self, flush: Callable[[], Awaitable[None]],
                         commit_processed: Callable[[], Awaitable[None]]) -> None:
        """As every worker's, and the checkpointed shards weighed are weighed again
        after the next assignment."""
        await super().on_revoked(flush, commit_processed)
        self._dormant.clear()

    def _wholly_read(self, key: str, last: float,
                     handled_as_of: Callable[[int], float | None] | None) -> bool:
        """Whether every partition the shard was read from was wholly handled after
        its last batch (always, without ``handled_as_of``)."""
        if handled_as_of is None:
            return True
        parts = [p for steps, p in self.folded.get(key, {}) if not steps]
        return bool(parts) and all((handled_as_of(p) or float("-inf")) > last
                                   for p in parts)

    async def _send(self, shard: ShardEngine, out: list[Summary], bins: int) -> None:
        """Send a shard's summaries, in parts, then checkpoint it when due."""
        job = shard.job
        key = shard.engine.job.encode()
        for summary in out:
            for part in split_parts(summary):
                await self.summary_outlets.summary(key, encode_summary_fast(part))
                self.summaries_sent += 1
        due = self.since_checkpoint.get(job, 0) + bins
        if due >= self.cfg.worker.checkpoint_steps:  # after the sends, never before
            self.checkpoint(shard)
            due = 0
        self.since_checkpoint[job] = due

    def status_messages(self, now: float,
                        lag: dict[str, int]) -> list[JobStatus | WorkerStatus]:
        """Only the heartbeat: a shard's heat is stage 2's to show."""
        return [worker_status(self.worker_id, now, dict(lag), self.samples,
                              self.deadletters, len(self.live))]


_encoder = msgspec.json.Encoder()


def encode_summary_fast(part: Summary) -> bytes:
    """``contracts.summary.encode_summary``, serialised by msgspec: validated first
    the same way, the same JSON once decoded, ``ContractError`` over the message size.
    json.dumps cost 144 µs a part, msgspec 23 (bench/RESULTS.md, issue #46, stage 1).
    A NaN the validation does not look at (deep in an event's evidence) is written
    as null, where json.dumps raised."""
    return encode_summary(part, _encoder.encode)


def _dormant_of(state: dict[str, Any] | None,
                key: str) -> tuple[frozenset[int], str, int, float | None]:
    """A checkpointed shard as ``revive_stalling`` weighs it: the partitions it was
    read from, its job, its job's shard count, the newest sample time it holds."""
    if not state:
        return frozenset(), "", 1, None
    job, _, shards = _unpack(state, key)
    parts = frozenset(int(p) for p in (state.get(SOURCE_OFFSETS) or {}))
    newest = (state.get("engine") or {}).get("max_ts")
    return parts, job, shards, None if newest is None else float(newest)


def _unpack(state: dict[str, Any] | None, key: str) -> tuple[str, int, int]:
    """(job, shard, shards) of a checkpointed shard, or as its key reads."""
    if state and "job" in state:
        return str(state["job"]), int(state["shard"]), int(state["shards"])
    return split_key(key)
