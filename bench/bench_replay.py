"""`vigil replay`'s rate against plain parsing of the same file, in one run.

    .venv/bin/python bench/bench_replay.py [--trace PATH] [--seconds 300] [--repeat 3]
                                           [--without-stragglers] [--jobs 2,4]

Without ``--trace`` it writes the mixed trace first (12 jobs of 2 to 16 nodes, one
slow GPU each; ``bench_worker.MIXED_SIZES``) to ``.vigil/bench-replay/mixed.jsonl``.
Then, alternating ``--repeat`` times: ``orjson.loads`` over every line (the floor
of any JSON reader), and replay exactly as `vigil replay` runs it (decode and
validate, windows, detectors, detections encoded), with its parts timed apart on
the same samples: decode, ingest (no evaluation), ingest and evaluation.
``--jobs 2,4``: each round also replays the file as `vigil replay --jobs N` does
(``vigil.replay_jobs``: the trace's jobs over N forked processes), checks that the
detections are the same bytes as one process's, and gives its wall time and its CPU
time (parent and processes together: on a shared machine the CPU time says what the
work costs, the wall time what N cores bought). ``--without-stragglers``: the what-if
of ``bench_detectors.py`` (the straggler test skipped), for the most a faster straggler
step could gain.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from bench_detectors import without_stragglers
from bench_worker import START, _cluster

from vigil_gpu_monitor.contracts.codec import encode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import JobEngine, ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Simulator
from vigil_gpu_monitor.streams.decode import decode_sample_fast
from vigil_gpu_monitor.vigil.commands import trace_samples
from vigil_gpu_monitor.vigil.replay_jobs import replay_jobs


def write_trace(path: Path, seconds: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for sample in Simulator(_cluster(0, mixed=True), START, seed=3).samples(seconds):
            out.write(encode_sample(sample) + b"\n")


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def replay(path: Path) -> tuple[float, float, bytes]:
    """What `vigil replay PATH` does; (wall seconds, CPU seconds, detections)."""
    t0, c0 = time.perf_counter(), _cpu()
    runner = ReplayRunner(DetectConfig())
    out = io.BytesIO()
    for sample in trace_samples(str(path)):
        for detection in runner.feed(sample):
            out.write(encode_detection(detection) + b"\n")
    return time.perf_counter() - t0, _cpu() - c0, out.getvalue()


def replay_over(path: Path, processes: int) -> tuple[float, float, bytes]:
    """What `vigil replay PATH --jobs N` does; (wall seconds, CPU seconds, detections)."""
    t0, c0 = time.perf_counter(), _cpu()
    outcome = replay_jobs(str(path), processes, DetectConfig())
    if outcome is None:
        raise SystemExit("the plan misread a line: --jobs fell back to one process")
    found = b"".join(d + b"\n" for d in outcome.detections)
    return time.perf_counter() - t0, _cpu() - c0, found


def parts(lines: list[bytes]) -> dict[str, float]:
    """µs per node-sample of decoding, ingest alone, and ingest with evaluation."""
    t0 = time.perf_counter()
    for line in lines:  # each sample dropped after it is decoded, as replay does: kept
        decode_sample_fast(line)  # all, they made the collector walk a growing heap
    decode = time.perf_counter() - t0
    samples = [decode_sample_fast(line) for line in lines]
    engines: dict[str, JobEngine] = {}
    t0 = time.perf_counter()
    for s in samples:
        engine = engines.get(s["job"]) or engines.setdefault(s["job"],
                                                             JobEngine(s["job"], DetectConfig()))
        engine.ingest(s)
    ingest = time.perf_counter() - t0
    samples = [decode_sample_fast(line) for line in lines]
    runner = ReplayRunner(DetectConfig())
    t0 = time.perf_counter()
    for s in samples:
        runner.feed(s)
    both = time.perf_counter() - t0
    n = len(lines)
    return {"decode": decode / n * 1e6, "ingest": ingest / n * 1e6,
            "evaluate": (both - ingest) / n * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", default="",
                        help="comma list of process counts to replay with as well (--jobs N)")
    parser.add_argument("--skip-parts", action="store_true",
                        help="leave out the parts' timing (it holds every sample decoded)")
    parser.add_argument("--without-stragglers", action="store_true",
                        help="what-if: skip the straggler test (the most a faster one gains)")
    args = parser.parse_args()
    if args.without_stragglers:
        without_stragglers()
    path = args.trace or Path(".vigil/bench-replay/mixed.jsonl")
    if args.trace is None and not path.exists():
        write_trace(path, args.seconds)
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    print(f"{path}: {len(lines):,} node-samples, {sum(map(len, lines)) / len(lines) / 1024:.1f} "
          "KB a line")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for line in lines:
            orjson.loads(line)
        parse = len(lines) / (time.perf_counter() - t0)
        spent, cpu, found = replay(path)
        detections = found.count(b"\n")
        rate = len(lines) / spent
        print(f"orjson.loads {parse:9,.0f}/s | replay {rate:7,.0f} node-samples/s "
              f"({spent:.2f} s, CPU {cpu:.2f} s, {detections} detections) = "
              f"{rate / parse:.1%} of parsing", flush=True)
        for processes in [int(n) for n in args.jobs.split(",") if n]:
            wall, cpu_n, found_n = replay_over(path, processes)
            same = "same detections" if found_n == found else "DETECTIONS DIFFER"
            print(f"  --jobs {processes}: {len(lines) / wall:7,.0f} node-samples/s "
                  f"({wall:.2f} s, CPU {cpu_n:.2f} s), {spent / wall:.2f}x one process, "
                  f"{same}", flush=True)
    if args.skip_parts:
        return 0
    cost = parts(lines)
    print("µs per node-sample: " + ", ".join(f"{k} {v:.0f}" for k, v in cost.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
