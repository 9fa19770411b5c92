"""Does the sharding seam hold on a trace? Each node's sealed bins, one stage against
shards that place clocks and seal on their own (docs/sharding.md).

    .venv/bin/python bench/bench_shard_seam.py TRACE [TRACE ...] [--shards 2,4,8]
    .venv/bin/python bench/bench_shard_seam.py --simulate-gpus 16384 --seconds 80 --shards 8

The seam of docs/sharding.md sends stage 2 each node's bin means as stage 1 sealed
them. Stage 2 then runs the one-stage detectors on them unchanged, so detections are
equal exactly where the sealed bins are. Stage 1 differs from one stage in two
job-wide inputs only: the job's clock (a shard takes the median of its own nodes)
and the watermark (a shard seals by its own newest sample). This replays each trace
once as one stage and once split into ``--shards`` groups of each job's nodes
(``crc32(node) mod shards``), every engine ingesting and sealing as ``JobEngine``
does (no detector runs), and compares every node's rows of every sealed bin, bit for
bit, and the late samples. ``--simulate-gpus N`` first writes a trace of one job of
N GPUs with faults (``simulated``) to ``.vigil/bench-seam/`` and adds it to the
traces. ``--shared-clock``: the shards of a job share one clock
(``ClockOffsets``), as they would if stage 2 published the job's clock back to
stage 1 without delay: what is left then is the watermark's part.
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.detectors.clocks import ClockOffsets
from vigil_gpu_monitor.detectors.engine import JobEngine, NodeMoves
from vigil_gpu_monitor.vigil.commands import trace_samples

# (job, bin, node) → the node's GPU and NIC rows of that sealed bin, as bytes
Rows = dict[tuple[str, int, str], bytes]


def seal_only(engine: JobEngine) -> list[int]:
    """``JobEngine.advance`` without the evaluation: seal every bin the watermark
    closed; the bins sealed."""
    if engine.max_ts is None or engine.next_bin is None:
        return []
    closed = engine.window.bin_of(engine.max_ts - engine.cfg.grace_seconds)
    engine._skip_gap(closed)
    done = []
    while engine.next_bin < closed:
        engine.window.seal(engine.next_bin)
        done.append(engine.next_bin)
        engine.next_bin += 1
        engine._skip_gap(closed)
    engine.window.drop_before(engine.next_bin - engine.window_bins)
    engine.held.forget_before(engine.max_ts - engine.cfg.held_seconds)
    return done


def _rows(engine: JobEngine, b: int, out: Rows) -> None:
    sealed = engine.window.sealed.get(str(b))
    if sealed is None:
        return
    per_node: dict[str, list[bytes]] = {}
    for section in ("g", "n"):
        part = sealed[section]
        for (node, dev), row in zip(part.devices, part.means, strict=True):
            per_node.setdefault(node, []).append(section.encode() + dev.encode() + row.tobytes())
    for node, rows in per_node.items():
        out[(engine.job, b, node)] = b"|".join(rows)


def run(samples: Iterator[Sample], shards: int, cfg: DetectConfig,
        shared_clock: bool = False) -> tuple[Rows, int]:
    """Every node's sealed rows and the late samples, with each job split into
    ``shards`` engines (1: one stage)."""
    engines: dict[tuple[str, int], JobEngine] = {}
    clocks: dict[str, ClockOffsets] = {}
    moves = NodeMoves()
    out: Rows = {}
    for sample in samples:
        left = moves.left(sample)
        if left is not None:
            for (job, _), owner in engines.items():
                if job == left:
                    owner.node_left(sample["node"])
        if not sample["job"]:
            continue
        key = (sample["job"], zlib.crc32(sample["node"].encode()) % shards)
        engine = engines.get(key)
        if engine is None:
            engine = engines[key] = JobEngine(sample["job"], cfg)
            if shared_clock:
                engine.clocks = clocks.setdefault(sample["job"], engine.clocks)
        engine.ingest(sample)
        for b in seal_only(engine):
            _rows(engine, b, out)
    return out, sum(e.late for e in engines.values())


def simulated(gpus: int, seconds: float) -> Path:
    """A trace of one job of ``gpus`` GPUs (8 a node) with faults from 30 s: a slow
    GPU, an XID, a thermal GPU, a node falling silent, a node whose clock is 30 s
    ahead; clocks skewed by up to ±1 s, 1 % of messages lost."""
    from vigil_gpu_monitor.contracts.codec import encode_sample
    from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

    path = Path(f".vigil/bench-seam/sim-{gpus}-{seconds:g}.jsonl")
    if path.exists():
        return path
    nodes = [f"node-{i:05d}" for i in range(max(1, gpus // 8))]
    start, at = 1_860_000_000.0, 1_860_000_030.0
    faults = [Fault("slow_gpu", "sim", nodes[0], "1", at), Fault("xid", "sim", nodes[-1], "2", at),
              Fault("thermal", "sim", nodes[len(nodes) // 2], "5", at),
              Fault("node_silent", "sim", nodes[len(nodes) // 3], None, at + 10)]
    cluster = Cluster([JobSpec("sim", nodes)], faults, skew_seconds=1.0, loss=0.01,
                      offsets={nodes[len(nodes) // 4]: 30.0})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for sample in Simulator(cluster, start, seed=11).samples(seconds):
            out.write(encode_sample(sample) + b"\n")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="*")
    parser.add_argument("--simulate-gpus", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=80.0)
    parser.add_argument("--shards", default="2,4,8")
    parser.add_argument("--shared-clock", action="store_true",
                        help="the shards of a job share the job's clock")
    args = parser.parse_args()
    cfg = DetectConfig()
    traces = list(args.traces)
    if args.simulate_gpus:
        traces.append(str(simulated(args.simulate_gpus, args.seconds)))
    for trace in traces:
        t0 = time.perf_counter()
        one, late_one = run(trace_samples(trace), 1, cfg)
        print(f"{trace}: one stage: {len(one):,} node-bins sealed, {late_one} late samples "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        for shards in (int(s) for s in args.shards.split(",")):
            split, late = run(trace_samples(trace), shards, cfg, args.shared_clock)
            same = sum(1 for k, v in one.items() if split.get(k) == v)
            missing = len(one.keys() - split.keys())
            extra = len(split.keys() - one.keys())
            print(f"  {shards} shards: {same:,} of {len(one):,} node-bins bit-identical, "
                  f"{len(one) - same - missing} differ, {missing} missing, {extra} extra; "
                  f"{late} late samples", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
