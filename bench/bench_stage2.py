"""What the job-level stage of a sharded job costs: every window detector over sealed
bins of a very large job, a bin at a time (docs/sharding.md).

    .venv/bin/python bench/bench_stage2.py [--nodes 2048,16384] [--steps 12]

Stage 2 of the sharded design receives each node's bin means (what ``JobWindow.seal``
keeps) and runs the job-level detectors on them: ``JobEngine.findings`` over sealed
bins, exactly the one-stage engine's step without the ingest. This bench builds those
bins directly, without samples: a simulated 2-node job (8 GPUs and 8 NICs a node,
our simulator, seed 1) is replayed for 90 s, and each of its sealed bins gives the
template of a node's bin; the ``--nodes`` nodes of the large job take the template's
rows with 2 % of noise on the activity and traffic counters (each GPU its own level
and each bin its own draw). One window of bins is evaluated first (the detectors
learn from it), then ``--steps`` steps are timed (CPU time of this process) and the
window's sealed state is measured (``tracemalloc``). Health and silence are not in
it (stage 1's, and one comparison a node at stage 2).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from bench_detectors import START

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import WINDOW_GPU, WINDOW_NIC, JobEngine
from vigil_gpu_monitor.detectors.window import Entity, SealedSection
from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator

NOISY = {"sm_active", "tensor_active", "dram_active", "gpu_util", "mma_cycles_active",
         "nvlink_tx", "nvlink_total", "ib_tx", "ib_rx", "ib_xmit_wait"}


def templates(seconds: float = 90.0) -> list[dict[str, np.ndarray]]:
    """One node's bin means (GPU rows, NIC rows) for each sealed bin of a healthy
    simulated 2-node job, its first minute skipped."""
    job = JobSpec("template", ["t-0", "t-1"])
    engine = JobEngine("template", DetectConfig())
    for sample in Simulator(Cluster([job], []), START, seed=1).samples(seconds):
        engine.ingest(sample)
        engine.advance()
    out = []
    for b in sorted(engine.window.sealed, key=int)[-6:]:
        bin_ = engine.window.sealed[b]
        rows = {k: np.array([r for (node, _), r in zip(part.devices, part.means, strict=True)
                             if node == "t-0"]) for k, part in bin_.items()}
        out.append(rows)
    return out


class LargeJob:
    """Sealed bins of ``nodes`` nodes built from the templates."""

    def __init__(self, nodes: int, seed: int = 1) -> None:
        self.rng = np.random.default_rng(seed)
        self.templates = templates()
        t = self.templates[0]
        names = [f"node-{i:05d}" for i in range(nodes)]
        self.gpus: list[Entity] = [(n, str(k)) for n in names for k in range(len(t["g"]))]
        self.nics: list[Entity] = [(n, f"mlx5_{k}") for n in names for k in range(len(t["n"]))]
        self.nodes = nodes
        self.level = {k: 1 + 0.02 * self.rng.standard_normal(
            (nodes * len(t[k]), len(WINDOW_GPU if k == "g" else WINDOW_NIC)))
            for k in ("g", "n")}
        self.noisy = {"g": [i for i, m in enumerate(WINDOW_GPU) if m in NOISY],
                      "n": [i for i, m in enumerate(WINDOW_NIC) if m in NOISY]}

    def bin(self, b: int) -> dict[str, SealedSection]:
        """Bin ``b``'s sealed sections (device lists shared between bins, as sealing
        shares them)."""
        t = self.templates[b % len(self.templates)]
        out = {}
        for k, devices in (("g", self.gpus), ("n", self.nics)):
            means = np.tile(t[k], (self.nodes, 1))
            at = self.noisy[k]
            means[:, at] *= self.level[k][:, at] * (
                1 + 0.02 * self.rng.standard_normal((len(devices), len(at))))
            out[k] = SealedSection(devices, means)
        return out


def run(nodes: int, steps: int) -> dict[str, float]:
    """ms per step (median, p90, max) and sealed-window bytes per GPU at ``nodes``."""
    job = LargeJob(nodes)
    engine = JobEngine("large", DetectConfig())
    first = int(START // engine.cfg.bin_seconds)
    window = engine.window_bins
    engine.next_bin = first
    times = []
    gc.collect()
    tracemalloc.start()
    heap = 0.0
    for i in range(window + steps):
        b = first + i
        engine.window.sealed[str(b)] = job.bin(b)
        engine.max_ts = (b + 2) * engine.cfg.bin_seconds
        if i == window - 1:
            gc.collect()
            heap = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
        t0 = time.process_time()
        engine._evaluate(b)
        spent = time.process_time() - t0
        engine.next_bin = b + 1
        engine.window.drop_before(b + 2 - window)
        if i >= window:
            times.append(spent * 1e3)
    times.sort()
    return {"nodes": nodes, "gpus": len(job.gpus), "median_ms": statistics.median(times),
            "p90_ms": times[int(0.9 * (len(times) - 1))], "max_ms": times[-1],
            "window_kb_per_gpu": heap / len(job.gpus) / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", default="2048,16384")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    print("nodes | GPUs | step ms median / p90 / max | sealed window + engine KB a GPU")
    for nodes in (int(n) for n in args.nodes.split(",")):
        r = run(nodes, args.steps)
        print(f"{r['nodes']:,} | {r['gpus']:,} | {r['median_ms']:.0f} / {r['p90_ms']:.0f} / "
              f"{r['max_ms']:.0f} | {r['window_kb_per_gpu']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
