"""Memory per GPU of a sharded job's two stages, and of their checkpoints (issue #46,
docs/sharding.md).

    .venv/bin/python bench/bench_shard_memory.py --simulate-gpus 16384 --seconds 120 \\
        --scale 1,8 --stage1-seconds 60

Measured with ``tracemalloc``: the bytes allocated while a stage ran and still held
(Python objects and numpy buffers alike), sampled as it runs; RSS is not used (the
trace's other objects and the allocator's free lists would be in it).

- **Stage 1**: every shard's ``ShardEngine`` of the job (windows' open bins, held
  readings, clocks, health), fed the trace's samples as the stage-1 worker feeds
  them (each shard seals by its own watermark, ``seal_closed``; the summaries are
  dropped, as once sent to Kafka). The samples are decoded inside the traced span, so
  what an engine keeps of one is counted. At ``--scale`` C the trace's lines are sent
  C times under renamed nodes (``c3-node-00042``), in ``8 x C`` shards; only its
  first ``--stage1-seconds``. Reported: the median and the largest of the samples
  taken after the first window, per GPU.
- **Stage 2**: ``JobStage2`` at C times the job's nodes, fed the summaries stage 1
  sent (``bench_sharded_cost``: encoded, cloned, decoded, ``evaluate_ready``):
  the assembled window, every detector's memory, health, the incident tracker and
  the summaries waiting for their bin. Reported: right after a bin's evaluation
  (median), and the largest at any point (a whole bin's summaries held).
- **Checkpoints**: ``encode_state`` (orjson, then Zstandard: what the worker writes
  to its table) of each stage's state at the end, per GPU, and the JSON before
  compression.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_shard_seam import simulated
from bench_sharded_cost import cloned, record

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.shards import shard_of
from vigil_gpu_monitor.contracts.summary import decode_summary
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardEngine
from vigil_gpu_monitor.streams.decode import decode_sample_fast
from vigil_gpu_monitor.streams.state_codec import encode_state
from vigil_gpu_monitor.vigil.commands import trace_samples

GPUS_PER_NODE = 8


def _lines(path: Path, scale: int, limit: int) -> Iterator[bytes]:
    """The trace's first ``limit`` sample lines, each ``scale`` times under renamed
    nodes."""
    with path.open("rb") as f:
        for i, line in enumerate(f):
            if i >= limit:
                return
            for c in range(scale):
                yield line if c == 0 else line.replace(b'"node":"', b'"node":"c%d-' % c, 1)


def stage1(path: Path, scale: int, shards: int, lines: int,
           cfg: DetectConfig) -> dict[str, float]:
    """Stage 1's bytes per GPU (median, max after the first window) and checkpoint."""
    k = shards * scale
    gc.collect()
    tracemalloc.start()
    engines: dict[int, ShardEngine] = {}
    seen: set[str] = set()
    held: list[int] = []
    first: float | None = None
    for i, line in enumerate(_lines(path, scale, lines)):
        sample = decode_sample_fast(line)
        node = sample["node"]
        seen.add(node)
        shard = shard_of(node, k)
        engine = engines.get(shard)
        if engine is None:
            engine = engines[shard] = ShardEngine(sample["job"], shard, k, cfg)
        engine.ingest(sample)
        engine.seal_closed()
        first = sample["ts"] if first is None else first
        if i % 2000 == 0 and sample["ts"] - first > cfg.window_seconds / 2:
            held.append(tracemalloc.get_traced_memory()[0])
    del sample, line
    gc.collect()
    held.append(tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    gpus = len(seen) * GPUS_PER_NODE
    states = [orjson.dumps(e.to_state()) for e in engines.values()]
    blobs = [encode_state(e.to_state()) for e in engines.values()]
    return {"gpus": gpus, "nodes": len(seen), "median": statistics.median(held) / gpus,
            "max": max(held) / gpus, "json": sum(map(len, states)) / gpus,
            "checkpoint": sum(map(len, blobs)) / gpus}


def stage2(path: Path, scale: int, shards: int, cfg: DetectConfig) -> dict[str, float]:
    """Stage 2's bytes per GPU (after a bin's evaluation: median; at any point: max)
    and checkpoint."""
    rec = record(trace_samples(str(path)), "sim", shards, cfg)
    gc.collect()
    tracemalloc.start()
    st = JobStage2(rec.job, rec.shards * scale, cfg)
    after: list[int] = []
    peak = 0
    for raw in cloned(rec, scale):
        summary = decode_summary(raw)
        st.receive(summary)
        del summary
        before = st.engine.next_bin
        st.evaluate_ready()
        now = tracemalloc.get_traced_memory()[0]
        peak = max(peak, now)
        if st.engine.next_bin != before and before is not None:
            after.append(now)
    gc.collect()
    tracemalloc.stop()
    nodes = len(st.node_state)
    gpus = nodes * GPUS_PER_NODE
    window = max(1, int(cfg.window_seconds // cfg.bin_seconds))
    steady = after[window:] or after
    state = st.to_state()
    return {"gpus": gpus, "nodes": nodes, "median": statistics.median(steady) / gpus,
            "max": peak / gpus, "json": len(orjson.dumps(state)) / gpus,
            "checkpoint": len(encode_state(state)) / gpus}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate-gpus", type=int, default=16384)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--scale", default="1,8")
    parser.add_argument("--stage1-seconds", type=float, default=60.0)
    parser.add_argument("--stages", default="1,2")
    args = parser.parse_args()
    cfg = DetectConfig()
    path = simulated(args.simulate_gpus, args.seconds)
    stages = args.stages.split(",")
    print("stage | GPUs | held a GPU: median / max | checkpoint a GPU (JSON before zstd)")
    for scale in (int(c) for c in args.scale.split(",")):
        found = []
        if "1" in stages:
            found.append(("1", stage1(path, scale, args.shards,
                                        int(args.stage1_seconds * args.simulate_gpus
                                            / GPUS_PER_NODE), cfg)))
        if "2" in stages:
            found.append(("2", stage2(path, scale, args.shards, cfg)))
        for name, r in found:
            print(f"{name} | {r['gpus']:,.0f} | {r['median'] / 1024:.2f} / {r['max'] / 1024:.2f} KB"
                  f" | {r['checkpoint'] / 1024:.2f} KB ({r['json'] / 1024:.2f} KB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
