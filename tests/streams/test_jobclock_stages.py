"""The job-clock feedback between the two stages' processors, without Kafka: stage 2
sends ``vigil.jobclock/1`` as it evaluates, stage 1 keeps each job's newest, and its
timer seals a silent shard's bins by the job's watermark, so stage 2 goes on and
finds the silent node (issue #46)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from typing import Any

from tests.streams.fakes import DictTable, FakeDelivered, FakeMessage
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.jobclock import encode_jobclock
from vigil_gpu_monitor.contracts.shards import shard_key, shard_of
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.streams.jobclock import JobClockFeed
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.stage1 import Stage1Processor
from vigil_gpu_monitor.streams.stage2 import Stage2Processor

START = 1_898_100_000.0
NAMES = ["a-0", "a-1", "a-4", "a-5"]  # one node a shard at 4 shards
SHARDS = 4


class _Store(DictTable):
    """A checkpoint table, and the outlets of both stages."""

    def __init__(self) -> None:
        super().__init__()
        self.summaries: list[bytes] = []
        self.detections: list[dict[str, Any]] = []
        self.deadletters: list[bytes] = []

    async def summary(self, key: bytes, value: bytes) -> None:
        self.summaries.append(value)

    async def detection(self, key: bytes, value: bytes, headers: dict[str, bytes]) -> None:
        self.detections.append(dict(decode_detection(value)))

    async def deadletter(self, key: bytes | None, value: bytes) -> None:
        self.deadletters.append(value)


class _Topics:
    """Messages as Faust delivers them, each topic's offsets counting on from 0."""

    def __init__(self) -> None:
        self.offset = {"samples": 0, "summaries": 0}

    def __call__(self, topic: str, items: list[tuple[bytes, bytes]]) -> list[FakeDelivered]:
        out = []
        for key, value in items:
            out.append(FakeDelivered(value, FakeMessage(key, topic, 0, self.offset[topic],
                                                        None)))
            self.offset[topic] += 1
        return out


def test_a_silent_shard_is_sealed_by_the_jobs_watermark_and_its_node_found_silent() -> None:
    assert len({shard_of(n, SHARDS) for n in NAMES}) == SHARDS
    cluster = Cluster([JobSpec("fb", NAMES)], [Fault("node_silent", "fb", NAMES[0], None,
                                                     START + 40)])
    samples = list(Simulator(cluster, START, seed=2).samples(120))
    cfg = Config()
    one, two = _Store(), _Store()
    stage1 = Stage1Processor(cfg, WorkerMetrics(), one, one, "s1")
    clocks: list[bytes] = []

    async def send_jobclock(key: bytes, value: bytes) -> None:
        clocks.append(value)
        stage1.jobclocks.take(value)  # every stage-1 worker reads the topic

    stage2 = Stage2Processor(cfg, WorkerMetrics(), two, two, "s2", send_jobclock)
    deliver = _Topics()

    async def run() -> None:
        for i in range(0, len(samples), 20):
            batch = [(shard_key("fb", s["node"], SHARDS).encode(), encode_sample(s))
                     for s in samples[i:i + 20]]
            await stage1.handle(deliver("samples", batch))
            # the silent node's shard has no sample any more: only the timer seals it
            await stage1.seal_by_jobclock(time.monotonic() + 60)
            sent, one.summaries = one.summaries, []
            await stage2.handle(deliver("summaries", [(b"fb", v) for v in sent]))

    asyncio.run(run())
    assert two.deadletters == [] and one.deadletters == []
    assert clocks and stage2.jobclocks_sent == len(clocks)
    last = json.loads(clocks[-1])
    assert last["shards"] == SHARDS and last["voters"] >= 3
    assert [(d["kind"], d["node"]) for d in two.detections if d["state"] == "firing"] == [
        ("node_silent", NAMES[0])]
    evaluated = stage2.live["fb"].engine.next_bin  # type: ignore[attr-defined]
    assert evaluated * 5.0 > START + 100, "stage 2 must not stall on the silent shard"


def _clock(next_bin: int | None, max_ts: float | None, shards: int = 2) -> bytes:
    return encode_jobclock({"schema": "vigil.jobclock/1", "job": "j", "shards": shards,
                            "bin_seconds": 5.0, "next_bin": next_bin, "max_ts": max_ts,
                            "clock": 100.0, "reference": 0.5, "voters": 8,
                            "at": 99.0, "bin": next_bin})


def test_the_feed_keeps_each_jobs_newest_clock_and_counts_what_it_refuses() -> None:
    feed = JobClockFeed()
    assert feed.take(_clock(20, 105.0)) is not None
    assert feed.take(_clock(19, 110.0)) is None  # behind the one held: compaction's order
    assert feed.take(None) is None  # a tombstone
    assert feed.take(b'{"schema": "vigil.jobclock/1"}') is None
    assert feed.take(b"not json") is None
    assert feed.refused == 2
    held = feed.get("j")
    assert held is not None and held["next_bin"] == 20
    assert feed.take(_clock(3, 1.0, shards=4)) is not None  # the job's count changed
    assert feed.get("missing") is None


def _at(moment: float, partition: int) -> float:
    return moment


def _restarted_run(revive: bool) -> tuple[list[tuple[str, str]], float, list[str]]:
    """The silent-node job through both stages, stage 1 handed over at 80 s (its
    shards checkpointed, a new processor on the same table): the silent node's
    shard has no sample after that to make it live again."""
    cluster = Cluster([JobSpec("fb", NAMES)], [Fault("node_silent", "fb", NAMES[0], None,
                                                     START + 40)])
    samples = list(Simulator(cluster, START, seed=2).samples(160))
    cfg = Config()
    one, two = _Store(), _Store()
    stages = [Stage1Processor(cfg, WorkerMetrics(), one, one, "s1")]
    clocks: list[bytes] = []

    async def send_jobclock(key: bytes, value: bytes) -> None:
        clocks.append(value)
        stages[-1].jobclocks.take(value)

    stage2 = Stage2Processor(cfg, WorkerMetrics(), two, two, "s2", send_jobclock)
    deliver = _Topics()
    revived: list[str] = []

    async def nothing() -> None:
        return None

    async def run() -> None:
        handed_over = False
        for i in range(0, len(samples), 20):
            batch = samples[i:i + 20]
            if not handed_over and batch[0]["ts"] >= START + 80:
                await stages[-1].on_revoked(nothing, nothing)  # checkpoints every shard
                stages.append(Stage1Processor(cfg, WorkerMetrics(), one, one, "s1b"))
                stages[-1].jobclocks.take(clocks[-1])  # the compacted topic, read whole
                handed_over = True
            stage1 = stages[-1]
            await stage1.handle(deliver("samples", [
                (shard_key("fb", s["node"], SHARDS).encode(), encode_sample(s))
                for s in batch]))
            now = time.monotonic()
            read_whole = functools.partial(_at, now + 30)  # partition 0 wholly read since
            if revive:
                revived.extend(await stage1.revive_stalling({0}, read_whole, now))
            await stage1.seal_by_jobclock(now + 60, read_whole)
            sent, one.summaries = one.summaries, []
            await stage2.handle(deliver("summaries", [(b"fb", v) for v in sent]))

    asyncio.run(run())
    assert two.deadletters == [] and one.deadletters == []
    found = [(d["kind"], d["node"]) for d in two.detections if d["state"] == "firing"]
    evaluated = stage2.live["fb"].engine.next_bin * 5.0  # type: ignore[attr-defined]
    return found, evaluated, revived


def test_a_silent_shard_a_restart_left_behind_is_revived_and_its_job_goes_on() -> None:
    stalled, stalled_at, _ = _restarted_run(revive=False)
    assert stalled_at < START + 90, "without revival the silent shard stalls its job"
    found, evaluated, revived = _restarted_run(revive=True)
    assert revived == [shard_key("fb", NAMES[0], SHARDS)]
    assert found == [("node_silent", NAMES[0])]
    assert evaluated > START + 140, "stage 2 must not stall on the silent shard"
