"""Detector cost per job size: CPU time to ingest a node-sample and to evaluate one
step (all detectors over the 60 s window), for jobs of 8 to 16,384 GPUs, and the
memory an engine holds per GPU.

    .venv/bin/python bench/bench_detectors.py [--sizes 8,64,512,4096,16384] [--memory]
                                              [--without-stragglers]

Sample generation (the simulator) is excluded from the timings. ``--memory`` runs
each size again under ``tracemalloc``: the Python heap the engine holds after the
run (window, held readings, detector memories, health), per GPU, and its checkpoint
(JSON, and compressed as the worker's table stores it), per GPU.

``--without-stragglers`` is a what-if, not a configuration: the straggler test finds
nothing and costs nothing (``without_stragglers``). The difference to a normal run
is the most that any faster straggler step (a compiled one) could gain.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

import orjson

import vigil_gpu_monitor.detectors.engine
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import JobEngine
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 1_900_000_000.0


def without_stragglers() -> None:
    """From now on in this process, every engine's straggler test is skipped (it
    finds nothing). For what-if timings only."""
    vigil_gpu_monitor.detectors.engine.find_stragglers = lambda view, params, memory: []  # type: ignore[assignment]


def slow_gpu_job(gpus: int) -> Cluster:
    """The benches' job: ``gpus`` GPUs, 8 a node, GPU 1 of its first node slow from
    90 s."""
    job = JobSpec("bench", [f"node-{i:05d}" for i in range(max(1, gpus // 8))],
                  gpus_per_node=min(8, gpus))
    return Cluster([job], [Fault("slow_gpu", "bench", job.nodes[0], "1", START + 90)])


def measure(gpus: int, seconds: float = 150.0) -> dict[str, float]:
    """Feed ``seconds`` of a job with one slow GPU (from 90 s: the straggler test
    learns each GPU's normal over its first minute); time ingest and evaluation
    apart."""
    nodes = max(1, gpus // 8)
    cluster = slow_gpu_job(gpus)
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
    from vigil_gpu_monitor.streams.state_codec import encode_state

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
    return {"heap": heap / gpus, "json": len(orjson.dumps(state)) / gpus,  # in this order
            "stored": len(encode_state(state)) / gpus}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="8,64,512,4096,16384")
    parser.add_argument("--memory", action="store_true", help="bytes held per GPU")
    parser.add_argument("--without-stragglers", action="store_true",
                        help="what-if: skip the straggler test (the most a faster one gains)")
    args = parser.parse_args()
    if args.without_stragglers:
        without_stragglers()
    sizes = [int(x) for x in args.sizes.split(",")]
    if args.memory:
        memory(8)  # the first engine of a process also fills lazy caches (~1 MB, some
        # first reached after a minute: a 30 s warm-up left them in the 8-GPU figure)
        _table(("GPUs", "heap KB/GPU", "checkpoint JSON KB/GPU", "stored KB/GPU"), sizes,
               lambda gpus: (gpus, *(f"{v / 1024:.1f}" for v in memory(gpus).values())))
    else:
        _table(("GPUs", "nodes", "ingest µs/node-sample", "eval ms/step", "eval µs/GPU/step",
                "found"), sizes, lambda gpus: _cost_row(measure(gpus)))
    return 0


def _cost_row(r: dict[str, float]) -> tuple[object, ...]:
    return (r["gpus"], r["nodes"], f"{r['ingest_us']:.0f}", f"{r['step_ms']:.1f}",
            f"{r['step_us_per_gpu']:.1f}", r["detected"])


def _table(header: tuple[str, ...], sizes: list[int],
           row: Callable[[int], tuple[object, ...]]) -> None:
    """Print one right-aligned row per size as it is measured."""
    widths = [max(6, len(h)) for h in header]
    print(" ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)), flush=True)
    for gpus in sizes:
        print(" ".join(str(c).rjust(w) for c, w in zip(row(gpus), widths, strict=True)),
              flush=True)

if __name__ == "__main__":
    raise SystemExit(main())
