"""Ingest and evaluation cost as CPU instructions (a node-sample, a step): figures
this shared, noisy machine cannot blur (wall and CPU times of the same code vary
twofold between sittings here).

    .venv/bin/python bench/bench_ingest.py [--gpus 64] [--seconds 150] [--every-metric]

Needs ``valgrind`` (``apt-get install valgrind``). The samples (a job of ``--gpus``
GPUs, 8 a node, one slow GPU from 90 s, our simulator's seed 1) are made once and
pickled; then ``callgrind`` counts the instructions of three runs of this file: one
that only loads them and builds an engine, one that also ingests every sample
(``JobEngine.ingest``: clock placement, window and held readings, health), one that
also evaluates every closed bin (``JobEngine.advance``: every detector, over the
window). The differences over the number of samples and of steps are the costs
(the steps include the first minute's, over a window not yet full). ``--every-metric`` gives
each GPU every window metric it lacks (0.0), as no real source does: the cost of a
device whose sample is read whole.
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_detectors import START, slow_gpu_job


def _make(path: Path, gpus: int, seconds: float, every_metric: bool) -> int:
    from vigil_gpu_monitor.detectors.engine import WINDOW_GPU
    from vigil_gpu_monitor.simulator.cluster import Simulator

    samples = list(Simulator(slow_gpu_job(gpus), START, seed=1).samples(seconds))
    if every_metric:
        for sample in samples:
            for readings in sample["gpus"].values():
                for metric in WINDOW_GPU:
                    readings.setdefault(metric, 0.0)
    path.write_bytes(pickle.dumps(samples))
    return len(samples)


def _run(path: Path, stage: str) -> None:
    from vigil_gpu_monitor.contracts.config import DetectConfig
    from vigil_gpu_monitor.detectors.engine import JobEngine

    samples = pickle.loads(path.read_bytes())
    warm = JobEngine("warm-up", DetectConfig())  # one-off costs (lazy imports, caches)
    for sample in samples[: len(samples) // 2]:  # in every stage alike: they cancel
        warm.ingest(sample)
        warm.advance()
    gc.collect()
    engine = JobEngine("bench", DetectConfig())
    steps = 0
    for sample in samples if stage != "load" else []:
        engine.ingest(sample)
        if stage == "advance":
            before = engine.next_bin
            engine.advance()
            steps += (engine.next_bin or 0) - (before or 0)
    print(f"steps {steps}")


def _instructions(path: Path, stage: str) -> tuple[int, int]:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--run", str(path), "--stage", stage],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"})  # the same dict layouts every run
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from callgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1)), int(out.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--every-metric", action="store_true")
    parser.add_argument("--run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stage", default="load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _run(args.run, args.stage)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "samples.pkl"
        count = _make(path, args.gpus, args.seconds, args.every_metric)
        (base, _), (ingest, _), (both, steps) = (
            _instructions(path, stage) for stage in ("load", "ingest", "advance"))
    print(f"{args.gpus} GPUs, {count} node-samples, {steps} steps"
          f"{', every window metric sent' if args.every_metric else ''}: "
          f"ingest {(ingest - base) / count / 1000:.0f}k instructions a node-sample, "
          f"evaluation {(both - ingest) / max(1, steps) / 1e6:.1f}M a step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
