"""Are a sharded job's detections those of one stage? (issue #46, docs/sharding.md)

    .venv/bin/python bench/bench_shard_equal.py --foreign ../shared/foreign --shards 2,4,8
    .venv/bin/python bench/bench_shard_equal.py --suite --shards 2,4
    .venv/bin/python bench/bench_shard_equal.py --simulate-gpus 16384 --seconds 120 --shards 8,16

Each trace is replayed by the one-stage runner and by ``ShardedReplayRunner`` (stage-1
shards of each job's nodes, ``crc32(node) mod K``, and a stage 2, in one process, the
job's clock and watermark fed back at once; every summary through the
``vigil.summary/2`` encoder and decoder, in parts), and their detections compared
(``vigil/evaluation/shardcheck.py``). ``--suite``: the scenario suite of ``vigil bench
detect`` (sizes and seeds as given). ``--simulate-gpus N``: one job of N GPUs with
faults (``bench_shard_seam.simulated``). ``--kafka-lag N``: the shards as over Kafka
(own clocks and watermarks; shard 0's summaries N samples late); with
``--feedback M`` stage 2's job clock (``vigil.jobclock/1``) reaches the shards M
samples after it was written (the clock a summary round trip old).
Exit status 1 when any differ.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vigil_gpu_monitor.vigil.evaluation.shardcheck import compare


def _trace(path: str) -> Callable[[], Iterable[Any]]:
    from vigil_gpu_monitor.vigil.commands import _sample_or_steps
    from vigil_gpu_monitor.vigil.tracefile import read_samples

    return lambda: read_samples(path, _sample_or_steps)


def _report(name: str, lines: Callable[[], Iterable[Any]], shards: list[int],
            evidence: bool, kafka_lag: int, feedback: int | None) -> bool:
    one_s, outcomes = compare(lines, shards, evidence=evidence, kafka_lag=kafka_lag,
                              feedback=feedback)
    ok = True
    for o in outcomes:
        ok = ok and o.equal
        print(f"{name}: {o.shards} shards: {'EQUAL' if o.equal else 'DIFFER'} "
              f"({o.one} detections one stage, {o.sharded} sharded; same order: "
              f"{o.same_order}; late {o.late_one} / {o.late_sharded}; "
              f"{one_s:.0f} s / {o.seconds:.0f} s; {o.summaries:,} summaries)", flush=True)
        for what, keys in (("only one stage", o.only_one), ("only sharded", o.only_sharded)):
            for key in keys[:10]:
                print(f"    {what}: {key}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="*")
    parser.add_argument("--foreign", help="the folder of base-5.jsonl.xz and hard-15.jsonl.xz")
    parser.add_argument("--suite", action="store_true")
    parser.add_argument("--sizes", default="2,4,8,16,32,64")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--simulate-gpus", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--shards", default="2,4,8")
    parser.add_argument("--evidence", action="store_true", help="compare evidence too")
    parser.add_argument("--kafka-lag", type=int, default=0, metavar="N",
                        help="run the shards as over Kafka (own clocks and watermarks, "
                             "no feedback), shard 0's summaries N samples behind")
    parser.add_argument("--feedback", type=int, default=None, metavar="M",
                        help="with --kafka-lag: stage 2's job clock fed back to the "
                             "shards, M samples on its way")
    args = parser.parse_args()
    shards = [int(s) for s in args.shards.split(",")]
    traces = list(args.traces)
    if args.foreign:
        traces += [str(Path(args.foreign) / f"{t}.jsonl.xz") for t in ("base-5", "hard-15")]
    if args.simulate_gpus:
        from bench_shard_seam import simulated
        traces.append(str(simulated(args.simulate_gpus, args.seconds)))
    ok = True
    for trace in traces:
        ok = _report(Path(trace).name, _trace(trace), shards, args.evidence,
                     args.kafka_lag, args.feedback) and ok
    if args.suite:
        from vigil_gpu_monitor.simulator.cluster import Simulator
        from vigil_gpu_monitor.vigil.evaluation.scenarios import suite

        scenarios = suite(sizes=tuple(int(s) for s in args.sizes.split(",")),
                          seeds=tuple(int(s) for s in args.seeds.split(",")))
        for sc in scenarios:
            def lines(sc: Any = sc) -> Iterable[Any]:
                return Simulator(sc.cluster, sc.start, seed=sc.seed).samples(sc.duration)
            ok = _report(sc.name, lines, shards, args.evidence, args.kafka_lag,
                         args.feedback) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
