"""Detector cost per job size: CPU time to ingest a node-sample and to evaluate one
step (all detectors over the 60 s window), for jobs of 8 to 16,384 GPUs, and the
memory an engine holds per GPU.

    .venv/bin/python bench/bench_detectors.py [--sizes 8,64,512,4096,16384] [--memory]

Sample generation (the simulator) is excluded from the timings. ``--memory`` runs
each size again under ``tracemalloc``: the Python heap the engine holds after the
run (window, held readings, detector memories, health), per GPU, and its checkpoint
(JSON, and compressed as the worker's table stores it), per GPU.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import orjson

from contracts.config import DetectConfig
from detectors.engine import JobEngine
from simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 1_900_000_000.0


def measure(gpus: int, seconds: float = 150.0) -> dict[str, float]:
    """Feed ``seconds`` of a job with one slow GPU (from 90 s: the straggler test
    learns each GPU's normal over its first minute); time ingest and evaluation
    apart."""
    nodes = max(1, gpus // 8)
    job = JobSpec("bench", [f"node-{i:05d}" for i in range(nodes)],
                  gpus_per_node=min(8, gpus))
    cluster = Cluster([job], [Fault("slow_gpu", "bench", job.nodes[0], "1", START + 90)])
    engine = JobEngine("bench", DetectConfig())
    ingest = evaluate = 0.0
    samples = steps = 0
    found = 0
    for sample in Simulator(cluster, START, seed=1).samples(seconds):
        t0 = time.process_time()
        engine.ingest(sample)
        t1 = time.process_time()
        before = engine.next_bin
        out = engine.advance()
        t2 = time.process_time()
        ingest += t1 - t0
        samples += 1
        if engine.next_bin != before and (sample["ts"] - START) > 60 + 10:
            evaluate += t2 - t1  # only steps with a full window
            steps += (engine.next_bin or 0) - (before or 0)
        found += sum(1 for d in out if d["kind"] == "straggler")
    return {"gpus": gpus, "nodes": nodes, "ingest_us": ingest / samples * 1e6,
            "step_ms": evaluate / max(1, steps) * 1e3,
            "step_us_per_gpu": evaluate / max(1, steps) / gpus * 1e6, "detected": found}


def memory(gpus: int, seconds: float = 150.0) -> dict[str, float]:
    """Bytes per GPU an engine holds after ``seconds`` of its job: live heap, and its
    checkpoint as JSON and as stored (``streams.state_codec``)."""
    from streams.state_codec import encode_state

    nodes = max(1, gpus // 8)
    job = JobSpec("bench", [f"node-{i:05d}" for i in range(nodes)],
                  gpus_per_node=min(8, gpus))
    samples = list(Simulator(Cluster([job], []), START, seed=1).samples(seconds))
    gc.collect()
    tracemalloc.start()
    engine = JobEngine("bench", DetectConfig())
    for sample in samples:
        engine.ingest(sample)
        engine.advance()
    del sample
    gc.collect()
    heap, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    state = engine.to_state()
    return {"heap": heap / gpus, "json": len(orjson.dumps(state)) / gpus,
            "stored": len(encode_state(state)) / gpus}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="8,64,512,4096,16384")
    parser.add_argument("--memory", action="store_true", help="bytes held per GPU")
    args = parser.parse_args()
    if args.memory:
        memory(8, 30.0)  # the first engine of a process also fills lazy module caches
        print(f"{'GPUs':>6} {'heap KB/GPU':>12} {'checkpoint JSON KB/GPU':>23} "
              f"{'stored KB/GPU':>14}")
        for gpus in (int(x) for x in args.sizes.split(",")):
            m = memory(gpus)
            print(f"{gpus:>6} {m['heap'] / 1024:>12.1f} {m['json'] / 1024:>23.1f} "
                  f"{m['stored'] / 1024:>14.1f}", flush=True)
        return 0
    print(f"{'GPUs':>6} {'nodes':>6} {'ingest µs/node-sample':>22} {'eval ms/step':>13} "
          f"{'eval µs/GPU/step':>17} {'found':>6}")
    for gpus in (int(x) for x in args.sizes.split(",")):
        r = measure(gpus)
        print(f"{r['gpus']:>6} {r['nodes']:>6} {r['ingest_us']:>22.0f} {r['step_ms']:>13.1f} "
              f"{r['step_us_per_gpu']:>17.1f} {r['detected']:>6}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
