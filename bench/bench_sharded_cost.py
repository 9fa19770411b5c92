"""What each stage of a sharded job costs, in one process (docs/sharding.md).

    .venv/bin/python bench/bench_sharded_cost.py --simulate-gpus 16384 --seconds 90 \\
        --shards 8 --scale 1,8 --gc pause,on

One simulated job (``bench_shard_seam.simulated``: faults, skewed clocks, 1 % loss)
through ``ShardedJob``, every summary encoded and split in parts as stage 1 sends it
(``vigil.summary/2``). Reported: the one-stage engine's CPU per node-sample on the
same samples; stage 1's (ingest, seal and the summary, every shard together); the
summaries' bytes per bin; and, for each ``--scale`` factor C, **stage 2's CPU per
bin over Kafka's path** at C times the job's nodes: the encoded parts recorded from
stage 1 are sent to a ``JobStage2`` of C times the shards, each part C times under
renamed nodes (``node-00042`` → ``node-00042-c3``) and shards (k → k + c·K), faults
and health kept; each part is decoded (``decode_summary``), received
(``JobStage2.receive``) and followed by ``evaluate_ready``, as the stage-2 worker
does. A bin's cost is everything stage 2 spent from the previous bin's evaluation to
its own (decode, receive, assembly, health union, ``JobEngine._evaluate``, the
incident tracker): median / p90 / max over the bins after the first window. Cloning
and encoding (stage 1's work) are not counted. At C = 1 the detections must be those
of ``ShardedJob`` (checked). CPU time of this process (``time.process_time``), one
core: numpy's thread pools are held to one thread.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable, Iterator  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_shard_seam import simulated  # noqa: E402

from vigil_gpu_monitor.contracts.config import DetectConfig  # noqa: E402
from vigil_gpu_monitor.contracts.messages import Detection, Sample, Summary  # noqa: E402
from vigil_gpu_monitor.contracts.summary import (  # noqa: E402
    decode_summary,
    encode_summary,
    split_parts,
)
from vigil_gpu_monitor.detectors.engine import ReplayRunner  # noqa: E402
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardedJob, ShardEngine  # noqa: E402
from vigil_gpu_monitor.streams.collector import collector_paused  # noqa: E402
from vigil_gpu_monitor.streams.decode import parse_json_fast  # noqa: E402
from vigil_gpu_monitor.vigil.commands import trace_samples  # noqa: E402


@dataclass
class Recorded:
    """Stage 1's side of a sharded run: its summaries' encoded parts, in the order
    stage 2 received them, and what it cost."""

    job: str
    shards: int
    parts: list[bytes] = field(default_factory=list)
    stage1_cpu: float = 0.0
    detections: list[Detection] = field(default_factory=list)
    bin_bytes: list[int] = field(default_factory=list)


def record(samples: Iterable[Sample], job: str, shards: int, cfg: DetectConfig) -> Recorded:
    """Run ``ShardedJob`` over ``samples``; keep every summary part as encoded."""
    rec = Recorded(job, shards)
    pending = [0]

    def deliver(summary: Summary) -> Summary:
        t = time.process_time()
        raw = [encode_summary(p) for p in split_parts(summary)]
        rec.stage1_cpu += time.process_time() - t
        rec.parts.extend(raw)
        pending[0] += sum(map(len, raw))
        return summary

    sharded = ShardedJob(job, shards, cfg, deliver)
    real_ingest, real_seal = ShardEngine.ingest, ShardEngine.seal
    real_evaluate = JobStage2.evaluate

    def ingest(self: ShardEngine, sample: Any, wait: float | None = None) -> Any:
        t = time.process_time()
        try:
            return real_ingest(self, sample, wait)
        finally:
            rec.stage1_cpu += time.process_time() - t

    def seal(self: ShardEngine, b: int) -> Any:
        t = time.process_time()
        try:
            return real_seal(self, b)
        finally:
            rec.stage1_cpu += time.process_time() - t

    def evaluate(self: JobStage2, b: int) -> Any:
        rec.bin_bytes.append(pending[0])
        pending[0] = 0
        return real_evaluate(self, b)

    ShardEngine.ingest = ingest  # type: ignore[method-assign]
    ShardEngine.seal = seal  # type: ignore[method-assign]
    JobStage2.evaluate = evaluate  # type: ignore[method-assign]
    try:
        for s in samples:
            rec.detections.extend(sharded.feed(s))
    finally:
        ShardEngine.ingest, ShardEngine.seal = real_ingest, real_seal  # type: ignore[method-assign]
        JobStage2.evaluate = real_evaluate  # type: ignore[method-assign]
    return rec


def cloned(rec: Recorded, scale: int) -> Iterator[bytes]:
    """Every recorded part, ``scale`` times: clone c under renamed nodes and shards."""
    for raw in rec.parts:
        if scale == 1:
            yield raw
            continue
        for c in range(scale):
            part = decode_summary(raw)

            def name(node: str, c: int = c) -> str:
                return f"{node}-c{c}" if c else node

            part["shard"] += c * rec.shards
            part["shards"] = rec.shards * scale
            part["nodes"] = {name(n): v for n, v in part["nodes"].items()}
            part["health"] = {name(n): v for n, v in part["health"].items()}
            for ev in part["events"]:
                if ev["node"] is not None:
                    ev["node"] = name(ev["node"])
            yield encode_summary(part)


@dataclass
class Stage2Run:
    """Stage 2's CPU per bin (decode, receive, evaluate), its detections, the stage."""

    bins: list[tuple[float, float, float]]
    detections: list[Detection]
    stage2: JobStage2


GC_MODES = ("pause", "pause-bin", "on", "off", "freeze")


def replay_stage2(rec: Recorded, scale: int, cfg: DetectConfig,
                  gc_mode: str = "pause") -> Stage2Run:
    """Stage 2 over Kafka's path at ``scale`` times the recorded job's nodes. The
    cyclic collector: ``pause``, off while each part is handled and on between
    them, as the worker pauses it for each batch (``streams/collector.py``; a
    batch of one part is the most often it comes back on); ``pause-bin``, off
    over each bin's parts and its evaluation (a batch that holds a whole bin: its
    parts arrive within the worker's 0.5 s batch window); ``on``, as Python runs
    it; ``off``, never (what-if: the collector's whole cost); ``freeze``,
    ``gc.freeze()`` after each bin (what-if: the collector no longer
    walks the state the stage keeps, only what a bin adds)."""
    stage2 = JobStage2(rec.job, rec.shards * scale, cfg)
    e = stage2.engine
    clock = time.process_time
    acc = [0.0, 0.0, 0.0]
    bins: list[tuple[float, float, float]] = []
    out: list[Detection] = []
    freeze = gc_mode == "freeze"
    paused = collector_paused() if gc_mode in ("pause-bin", "off") else nullcontext()
    paused.__enter__()
    for raw in cloned(rec, scale):
        t0 = clock()
        with collector_paused() if gc_mode == "pause" else nullcontext():
            summary = decode_summary(raw, parse_json_fast)
            t1 = clock()
            out.extend(stage2.receive(summary))
            t2 = clock()
            before = e.next_bin
            out.extend(stage2.evaluate_ready())
            if gc_mode == "pause-bin" and e.next_bin != before:
                paused.__exit__(None, None, None)  # the bin's collection, in its time
                paused = collector_paused()
                paused.__enter__()
        t3 = clock()
        acc[0] += t1 - t0
        acc[1] += t2 - t1
        acc[2] += t3 - t2
        if e.next_bin != before and before is not None:
            bins.append((acc[0], acc[1], acc[2]))
            acc = [0.0, 0.0, 0.0]
            if freeze:
                gc.freeze()
    paused.__exit__(None, None, None)
    if freeze:
        gc.unfreeze()
    return Stage2Run(bins, out, stage2)


def _ms(values: list[float]) -> str:
    s = sorted(values)
    return (f"{statistics.median(s) * 1e3:.0f} / {s[int(0.9 * (len(s) - 1))] * 1e3:.0f} / "
            f"{s[-1] * 1e3:.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate-gpus", type=int, default=16384)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--scale", default="1,8",
                        help="stage 2 at these multiples of the job's nodes")
    parser.add_argument("--skip-one-stage", action="store_true")
    parser.add_argument("--gc", default="pause",
                        help="the cyclic collector in stage 2, a comma-separated list of "
                             f"{', '.join(GC_MODES)} (replay_stage2 says what each is)")
    args = parser.parse_args()
    cfg = DetectConfig()
    samples = list(trace_samples(str(simulated(args.simulate_gpus, args.seconds))))
    job = samples[0]["job"]
    nodes = len({s["node"] for s in samples})
    print(f"{args.simulate_gpus:,} GPUs ({nodes:,} nodes), {len(samples):,} node-samples, "
          f"{args.shards} shards", flush=True)
    if not args.skip_one_stage:
        t0 = time.process_time()
        one = ReplayRunner(cfg)
        for s in samples:
            one.feed(s)
        print(f"one stage: {(time.process_time() - t0) / len(samples) * 1e6:.0f} us CPU "
              "a node-sample", flush=True)
    rec = record(samples, job, args.shards, cfg)
    count = len(samples)
    del samples
    print(f"stage 1 (ingest + seal + summary encoded, all shards): "
          f"{rec.stage1_cpu / count * 1e6:.0f} us CPU a node-sample; "
          f"{len(rec.parts):,} summary parts", flush=True)
    window = max(1, int(cfg.window_seconds // cfg.bin_seconds))
    sizes = rec.bin_bytes[window:] or rec.bin_bytes
    print(f"summaries a bin: {statistics.median(sizes) / 1e6:.2f} MB "
          f"({statistics.median(sizes) / nodes:.0f} bytes a node)", flush=True)
    modes = args.gc.split(",")
    if not set(modes) <= set(GC_MODES):
        parser.error(f"--gc: {args.gc!r}; each of {', '.join(GC_MODES)}")
    runs = [(int(c), mode) for mode in modes for c in args.scale.split(",")]
    for scale, mode in runs:
        gc.collect()
        run = replay_stage2(rec, scale, cfg, mode)
        steady = run.bins[window:] or run.bins
        total = [sum(b) for b in steady]
        same = "" if scale != 1 else (
            f"; detections equal to ShardedJob's: {run.detections == rec.detections}")
        print(f"stage 2 at {nodes * scale:,} nodes ({nodes * scale * 8:,} GPUs)"
              f", collector {mode}, "
              f"{len(run.bins)} bins ({len(steady)} timed): a bin {_ms(total)} "
              f"(median / p90 / max); of it decode {_ms([b[0] for b in steady])}, "
              f"receive {_ms([b[1] for b in steady])}, evaluate {_ms([b[2] for b in steady])}; "
              f"{len(run.detections)} detections{same}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
