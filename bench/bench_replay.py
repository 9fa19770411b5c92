"""`vigil replay`'s rate against plain parsing of the same file, in one run.

    .venv/bin/python bench/bench_replay.py [--trace PATH] [--seconds 300] [--repeat 3]
                                           [--without-stragglers]

Without ``--trace`` it writes the mixed trace first (12 jobs of 2 to 16 nodes, one
slow GPU each; ``bench_worker.MIXED_SIZES``) to ``.vigil/bench-replay/mixed.jsonl``.
Then, alternating ``--repeat`` times: ``orjson.loads`` over every line (the floor
of any JSON reader), and replay exactly as `vigil replay` runs it (decode and
validate, windows, detectors, detections encoded), with its parts timed apart on
the same samples: decode, ingest (no evaluation), ingest and evaluation.
``--without-stragglers``: the what-if of ``bench_detectors.py`` (the straggler test
skipped), for the most a faster straggler step could gain.
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).parent))

from bench_detectors import without_stragglers
from bench_worker import START, _cluster

from contracts.codec import encode_detection, encode_sample
from contracts.config import DetectConfig
from detectors.engine import JobEngine, ReplayRunner
from simulator.cluster import Simulator
from streams.decode import decode_sample_fast
from vigil.commands import trace_samples


def write_trace(path: Path, seconds: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for sample in Simulator(_cluster(0, mixed=True), START, seed=3).samples(seconds):
            out.write(encode_sample(sample) + b"\n")


def replay(path: Path) -> tuple[float, int]:
    """What `vigil replay PATH --out /dev/null` does; (seconds, detections)."""
    t0 = time.perf_counter()
    runner = ReplayRunner(DetectConfig())
    out = io.BytesIO()
    found = 0
    for sample in trace_samples(str(path)):
        for detection in runner.feed(sample):
            found += 1
            out.write(encode_detection(detection) + b"\n")
    return time.perf_counter() - t0, found


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
        spent, found = replay(path)
        rate = len(lines) / spent
        print(f"orjson.loads {parse:9,.0f}/s | replay {rate:7,.0f} node-samples/s "
              f"({spent:.2f} s, {found} detections) = {rate / parse:.1%} of parsing", flush=True)
    cost = parts(lines)
    print("µs per node-sample: " + ", ".join(f"{k} {v:.0f}" for k, v in cost.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
