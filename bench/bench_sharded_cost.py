"""What each stage of a sharded job costs, in one process (docs/sharding.md).

    .venv/bin/python bench/bench_sharded_cost.py --simulate-gpus 16384 --seconds 90 --shards 8

One simulated job (``bench_shard_seam.simulated``: faults, skewed clocks, 1 % loss)
through ``ShardedJob`` with every summary encoded, split in parts and decoded as over
Kafka. Reported: stage 1's CPU per node-sample (ingest and seal, every shard
together), the summaries' bytes per bin, and stage 2's CPU per bin (decoding the
summaries, assembling the bin, the health union, the evaluation), median / p90 /
max over the bins after the first window; and, for comparison, the one-stage
engine's CPU per node-sample on the same samples. CPU time of this process
(``time.process_time``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_shard_seam import simulated

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Summary
from vigil_gpu_monitor.contracts.summary import decode_summary, encode_summary, split_parts
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardedJob, ShardEngine
from vigil_gpu_monitor.vigil.commands import trace_samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate-gpus", type=int, default=16384)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    cfg = DetectConfig()
    samples = list(trace_samples(str(simulated(args.simulate_gpus, args.seconds))))
    job = samples[0]["job"]
    t0 = time.process_time()
    one = ReplayRunner(cfg)
    for s in samples:
        one.feed(s)
    one_cpu = time.process_time() - t0

    stage1_cpu = 0.0
    stage2_bins: list[float] = []
    wire_bytes: list[int] = []
    pending: list[bytes] = []

    def deliver(summary: Summary) -> Summary:
        raw = [encode_summary(p) for p in split_parts(summary)]
        pending.extend(raw)
        parts = [decode_summary(r) for r in raw]
        whole: Summary = {**parts[0], "part": 0, "parts": 1, "nodes": {}, "health": {}}
        for p in parts:
            whole["nodes"].update(p["nodes"])
            whole["health"].update(p["health"])
        return whole

    sharded = ShardedJob(job, args.shards, cfg, deliver)
    stage2 = sharded.stage2
    real_receive, real_evaluate = JobStage2.receive, JobStage2.evaluate
    spent = {"s2": 0.0}

    def receive(self: JobStage2, summary: Summary) -> Any:
        t = time.process_time()
        try:
            return real_receive(self, summary)
        finally:
            spent["s2"] += time.process_time() - t

    def evaluate(self: JobStage2, b: int) -> Any:
        t = time.process_time()
        try:
            return real_evaluate(self, b)
        finally:
            spent["s2"] += time.process_time() - t
            stage2_bins.append(spent["s2"])
            spent["s2"] = 0.0
            wire_bytes.append(sum(map(len, pending)))
            pending.clear()

    JobStage2.receive = receive  # type: ignore[method-assign]
    JobStage2.evaluate = evaluate  # type: ignore[method-assign]
    assert stage2 is sharded.stage2
    real_ingest, real_seal = ShardEngine.ingest, ShardEngine.seal
    s1 = {"cpu": 0.0}

    def ingest(self: ShardEngine, sample: Any) -> Any:
        t = time.process_time()
        try:
            return real_ingest(self, sample)
        finally:
            s1["cpu"] += time.process_time() - t

    def seal(self: ShardEngine, b: int) -> Any:
        t = time.process_time()
        try:
            return real_seal(self, b)
        finally:
            s1["cpu"] += time.process_time() - t

    ShardEngine.ingest = ingest  # type: ignore[method-assign]
    ShardEngine.seal = seal  # type: ignore[method-assign]
    for s in samples:
        sharded.feed(s)
    stage1_cpu = s1["cpu"]
    window = sharded.stage2.engine.window_bins
    steady = sorted(stage2_bins[window:]) or sorted(stage2_bins)
    sizes = wire_bytes[window:] or wire_bytes
    nodes = len({s["node"] for s in samples})
    print(f"{args.simulate_gpus:,} GPUs ({nodes:,} nodes), {len(samples):,} node-samples, "
          f"{args.shards} shards, {len(stage2_bins)} bins")
    print(f"one stage: {one_cpu / len(samples) * 1e6:.0f} us CPU a node-sample")
    print(f"stage 1 (ingest + seal + summary, all shards): "
          f"{stage1_cpu / len(samples) * 1e6:.0f} us CPU a node-sample")
    print(f"stage 2 a bin: {statistics.median(steady) * 1e3:.0f} ms median, "
          f"{steady[int(0.9 * (len(steady) - 1))] * 1e3:.0f} ms p90, {steady[-1] * 1e3:.0f} ms max "
          f"(receive + assemble + health + evaluate)")
    print(f"summaries a bin: {statistics.median(sizes) / 1e6:.2f} MB "
          f"({statistics.median(sizes) / nodes:.0f} bytes a node)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
