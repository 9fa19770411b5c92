"""Stage 1's per-message path without Kafka: what a `vigil worker --stage 1` adds to
Faust's own cost per sample (docs/sharding.md).

    .venv/bin/python bench/bench_stage1_path.py [--seconds 300] [--shards 2] [--rounds 3]
    .venv/bin/python bench/bench_stage1_path.py --parts     # decode / fold / summaries apart

The mixed trace of ``bench_worker.py --mixed`` (12 jobs of 2-16 nodes, 8 GPUs a node),
encoded as agents send it and keyed ``job#k/K``, goes through ``Stage1Processor.handle``
in batches of 500 (``take_events``' size), as Faust hands them over: decoding, the
key check, the aligner, each shard's ingest and seal, summaries encoded and "sent"
(to a list), checkpoints to a dict. CPU time of this process (``time.process_time``),
best of ``--rounds``; a fresh processor each round.

``--parts`` times the steps apart over the same samples: decoding alone, decoding
and folding into the shards' engines (``ShardEngine.ingest`` and ``seal_closed``),
and the summaries' encoding.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_worker import START, _cluster

from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.contracts.shards import shard_key
from vigil_gpu_monitor.contracts.summary import encode_summary, split_parts
from vigil_gpu_monitor.detectors.shard import ShardEngine
from vigil_gpu_monitor.simulator.cluster import Simulator
from vigil_gpu_monitor.streams.decode import decode_sample_fast
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.stage1 import Stage1Processor

BATCH = 500


class _Message:
    __slots__ = ("key", "topic", "partition", "offset", "timestamp", "headers")

    def __init__(self, key: bytes, offset: int) -> None:
        self.key, self.topic, self.partition, self.offset = key, "samples", 0, offset
        self.timestamp: float | None = None
        self.headers: Any = ()


class _Event:
    __slots__ = ("value", "message")

    def __init__(self, value: bytes, message: _Message) -> None:
        self.value, self.message = value, message


class _Outlets:
    def __init__(self) -> None:
        self.sent = 0
        self.bytes = 0

    async def summary(self, key: bytes, value: bytes) -> None:
        self.sent += 1
        self.bytes += len(value)

    async def deadletter(self, key: bytes | None, value: bytes) -> None:
        raise AssertionError("the bench's samples are valid")


def _trace(seconds: int, shards: int) -> list[tuple[bytes, bytes]]:
    samples = Simulator(_cluster(96, mixed=True), START, seed=1).samples(seconds)
    return [(shard_key(s["job"], s["node"], shards).encode(), encode_sample(s))
            for s in samples]


def _processor() -> tuple[Stage1Processor, _Outlets]:
    cfg = load()
    outlets = _Outlets()
    return Stage1Processor(cfg, WorkerMetrics(), outlets, {}, "bench"), outlets


def _whole(trace: list[tuple[bytes, bytes]]) -> tuple[float, _Outlets]:
    proc, outlets = _processor()
    events = [_Event(v, _Message(k, i)) for i, (k, v) in enumerate(trace)]

    async def run() -> None:
        for i in range(0, len(events), BATCH):
            await proc.handle(events[i:i + BATCH])
        await proc.release_waiting(time.monotonic() + 3600)  # what the aligner holds

    t0 = time.process_time()
    asyncio.run(run())
    return time.process_time() - t0, outlets


def _parts(trace: list[tuple[bytes, bytes]], shards: int) -> dict[str, float]:
    cfg = load()
    t0 = time.process_time()
    decoded = [decode_sample_fast(v) for _, v in trace]
    t1 = time.process_time()
    engines: dict[str, ShardEngine] = {}
    out: list[Any] = []
    for (key, _), sample in zip(trace, decoded, strict=True):
        name = key.decode()
        shard = engines.get(name)
        if shard is None:
            k = int(name.rsplit("#", 1)[1].split("/")[0]) if "#" in name else 0
            shard = engines[name] = ShardEngine(sample["job"], k, shards, cfg.detect)
        out.extend(shard.ingest(sample))
        out.extend(shard.seal_closed())
    t2 = time.process_time()
    for summary in out:
        for part in split_parts(summary):
            encode_summary(part)
    t3 = time.process_time()
    return {"decode": t1 - t0, "fold and seal": t2 - t1, "summaries encoded": t3 - t2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", action="store_true")
    args = parser.parse_args()
    trace = _trace(args.seconds, args.shards)
    n = len(trace)
    print(f"{n} node-samples, 12 jobs of 2-16 nodes, {args.shards} shards a job")
    if args.parts:
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for k, v in _parts(trace, args.shards).items():
                best[k] = min(best.get(k, v), v)
        for k, v in best.items():
            print(f"{k:>18}: {v / n * 1e6:6.1f} µs a node-sample")
        return 0
    times = []
    outlets = None
    for _ in range(args.rounds):
        spent, outlets = _whole(trace)
        times.append(spent)
    assert outlets is not None
    best_s = min(times)
    print(f"Stage1Processor.handle: {best_s / n * 1e6:.1f} µs a node-sample (best of "
          f"{args.rounds}: " + ", ".join(f"{t / n * 1e6:.1f}" for t in times)
          + f"), {n / best_s:,.0f} node-samples/s of CPU; "
          f"{outlets.sent} summary parts, {outlets.bytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
