"""Issue #47's done-when checks from step timings, on held-out seeds.

    .venv/bin/python bench/bench_steps.py [--seeds 61,62,63,64,65,66] [--counters]

Each case (``vigil/evaluation/stepcheck.py``) streams one simulated job's per-rank
timings (and with ``--counters`` its samples too) through the worker's engine: a
10 % slow rank (found within 2 min, at its GPU), a rank's and a node's CPU-side
stall (a straggler, ``remediable: false``), a pipeline's heavier last stage
(``load_imbalance``), σ 20 % sequence-length noise (nothing), and three costs
against the simulator's truth (within ±10 %). Prints one line a case and seed, then
the pass count and the delays and cost errors.
"""

from __future__ import annotations

import argparse
import statistics
import time

from vigil_gpu_monitor.vigil.evaluation.stepcheck import CASES, check


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="61,62,63,64,65,66")
    parser.add_argument("--counters", action="store_true",
                        help="stream the counters too: one incident per fault, merged")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    for case in CASES:
        for seed in seeds:
            began = time.perf_counter()
            r = check(case, seed, args.counters)
            results.append(r)
            print(f"{case:16s} seed {seed} {'PASS' if r.passed else 'FAIL'} "
                  f"({time.perf_counter() - began:4.1f} s) {r.why}", flush=True)
    passed = sum(r.passed for r in results)
    views = "counters + timings" if args.counters else "timings only"
    print(f"\n{passed} of {len(results)} passed ({views})")
    delays = [r.delay for r in results if r.case == "slow_rank" and r.delay is not None]
    if delays:
        print(f"10 % slow rank found in: median {statistics.median(delays):.0f} s, "
              f"max {max(delays):.0f} s")
    for case in ("cost_straggler", "cost_node", "cost_network"):
        errors = [(r.cost - r.truth) / r.truth for r in results
                  if r.case == case and r.cost is not None and r.truth]
        if errors:
            print(f"{case}: cost error {min(errors):+.1%} .. {max(errors):+.1%}")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
