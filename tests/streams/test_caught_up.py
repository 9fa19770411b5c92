"""When a partition was last wholly handled (``streams/caught_up.py``), and stage 1
sealing a quiet shard by its job's watermark only when nothing of it waits in Kafka:
the CI run of 2026-11-27 saw a restarted stage 1, slow between two batches of one
shard's backlog, seal that shard's bins ahead of its samples (issue #46)."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.streams.fakes import DictTable, FakeDelivered, FakeMessage
from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.jobclock import encode_jobclock
from vigil_gpu_monitor.contracts.shards import shard_key, shard_of
from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator
from vigil_gpu_monitor.streams.caught_up import CaughtUp
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.stage1 import Stage1Processor


def test_a_partition_is_handled_as_of_the_highwater_it_reached_less_its_staleness() -> None:
    c = CaughtUp(stale_seconds=2.0)
    c.note(0, 100, 40, now=10.0)  # 60 to go
    assert c.handled_as_of(0) is None
    c.note(0, 150, 90, now=11.0)  # more arrived; still behind the first
    assert c.handled_as_of(0) is None
    c.note(0, 150, 100, now=12.0)  # the first reached: wholly handled as of 10 - 2
    assert c.handled_as_of(0) == 8.0
    c.note(0, 150, 150, now=13.0)
    assert c.handled_as_of(0) == 9.0  # the second, noted at 11
    c.note(0, 150, 150, now=20.0)  # idle and handled: as of each reading
    assert c.handled_as_of(0) == 18.0
    c.note(0, None, 150, now=30.0)  # no fetch yet: nothing learned
    c.note(1, 10, None, now=30.0)  # nothing handled yet
    assert c.handled_as_of(0) == 18.0 and c.handled_as_of(1) is None
    c.reset()
    assert c.handled_as_of(0) is None


def test_a_partition_far_behind_keeps_a_bounded_list_and_its_oldest_highwater() -> None:
    c = CaughtUp(stale_seconds=0.0)
    for i in range(1000):
        c.note(0, 1000 + i, 0, now=float(i))
    assert c.handled_as_of(0) is None
    assert sum(len(q) for q in c._noted.values()) <= 64
    c.note(0, 2000, 1990, now=1000.0)
    assert c.handled_as_of(0) is not None and c.handled_as_of(0) < 1000.0


class _Out(DictTable):
    def __init__(self) -> None:
        super().__init__()
        self.summaries: list[bytes] = []

    async def summary(self, key: bytes, value: bytes) -> None:
        self.summaries.append(value)

    async def deadletter(self, key: bytes | None, value: bytes) -> None:
        raise AssertionError("no dead letter expected")


def test_a_quiet_shard_with_a_backlog_in_kafka_does_not_take_its_jobs_watermark() -> None:
    start = 1_898_200_000.0
    nodes = ["q-0", "q-4"]
    assert shard_of(nodes[0], 2) != shard_of(nodes[1], 2)
    samples = list(Simulator(Cluster([JobSpec("q", nodes)], []), start, seed=3).samples(60))
    mine = [s for s in samples if s["node"] == nodes[0] and s["ts"] < start + 30]
    out = _Out()
    stage1 = Stage1Processor(Config(), WorkerMetrics(), out, out, "s1")
    key = shard_key("q", nodes[0], 2)
    clock = encode_jobclock({"schema": "vigil.jobclock/1", "job": "q", "shards": 2,
                             "bin_seconds": 5.0, "next_bin": None,
                             "max_ts": start + 600.0, "clock": None, "reference": None,
                             "voters": 0, "at": None, "bin": None})
    assert stage1.jobclocks.take(clock) is not None
    events: list[Any] = [FakeDelivered(encode_sample(s), FakeMessage(key.encode(), "samples",
                                                                      3, i, None))
                         for i, s in enumerate(mine)]

    async def run() -> tuple[int, int, int]:
        await stage1.handle(events)
        assert stage1.handled[("samples", 3)] == len(mine)
        last = stage1.last_batch[key]
        behind = await stage1.seal_by_jobclock(last + 60, lambda p: None)
        stale = await stage1.seal_by_jobclock(last + 60, lambda p: last - 1.0)
        other = await stage1.seal_by_jobclock(last + 60, lambda p: last + 1 if p == 4 else None)
        before = stage1.live[key].engine.next_bin  # type: ignore[attr-defined]
        read = await stage1.seal_by_jobclock(last + 60, lambda p: last + 1.0)
        return behind + stale + other, read, before

    held_back, sealed, before = asyncio.run(run())
    assert held_back == 0
    after = stage1.live[key].engine.next_bin  # type: ignore[attr-defined]
    assert sealed > 0 and before * 5.0 < start + 30 < start + 500 < after * 5.0, \
        "wholly read and quiet: the job's watermark seals its bins"
