"""Cost estimates against the simulator's truth: how far each detection's
``job_slowdown`` is from the job's true step-time inflation.

    .venv/bin/python bench/bench_cost.py [--sizes 4,8,16,32] [--seeds 1,2,3] [--jobs N]

A detection is *within target* when its estimate is within ±25 % of the true
slowdown (relative), or, where the truth is under half a percentage point (a
fault that does not slow its job, e.g. a thermal GPU off a pipeline's critical
stage), within half a point of it. A hang is within target when it is costed as
a hang (the whole job). Two tables: the estimate each detection fires with (what
alerts, escalation and remediation's cost guard read), and the one its resolved
message carries (the incident's median estimate, against the truth over the whole
fault, which lasts 3 minutes). Cases run in ``--jobs`` processes.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

from vigil_gpu_monitor.vigil.evaluation.costcheck import CostCase, CostResult, cases, run_case

ABSOLUTE_FLOOR = 0.005


def within(r: CostResult) -> bool:
    """The target: ±25 % relative, or ±0.5 point where the truth is under 0.5 %."""
    if math.isinf(r.true):
        return r.basis == "hang"
    if r.estimate is None or math.isnan(r.true):
        return False
    if r.true < ABSOLUTE_FLOOR:
        return abs(r.estimate - r.true) <= ABSOLUTE_FLOOR
    return abs(r.estimate - r.true) <= 0.25 * r.true


def _band(true: float) -> str:
    if math.isinf(true):
        return "hang"
    for limit, name in ((0.005, "< 0.5 %"), (0.05, "0.5–5 %"), (0.15, "5–15 %"),
                        (0.4, "15–40 %")):
        if true < limit:
            return name
    return "≥ 40 %"


def _table(state: str, results: list[CostResult]) -> None:
    """One table of the ``state`` estimates: by kind, truth band, basis and seed."""
    print(f"\n{state}: {len(results)} costed detections of their faults")
    rows: dict[str, list[CostResult]] = defaultdict(list)
    for r in results:
        rows[f"{r.case.job_type} / {r.kind}"].append(r)
        rows[f"true slowdown {_band(r.true)}"].append(r)
        rows[f"basis {r.basis}"].append(r)
        rows[f"seed {r.case.seed}"].append(r)
    print("| group | detections | within target | median abs. rel. error | p90 abs. rel. error |")
    print("|---|---|---|---|---|")
    for name in sorted(rows):
        group = rows[name]
        errors = sorted(abs(e) for r in group if (e := r.relative_error) is not None
                        and r.true >= ABSOLUTE_FLOOR)
        med = f"{statistics.median(errors):.1%}" if errors else "–"
        p90 = f"{errors[min(len(errors) - 1, int(0.9 * len(errors)))]:.1%}" if errors else "–"
        ok = sum(within(r) for r in group)
        print(f"| {name} | {len(group)} | {ok} ({ok / len(group):.0%}) | {med} | {p90} |")
    ok = sum(within(r) for r in results)
    print(f"\n{state}, all: {ok} of {len(results)} within target "
          f"({ok / max(1, len(results)):.1%})")
    for r in results:
        if not within(r):
            print(f"  outside: {r.case.name} {r.kind} basis={r.basis} "
                  f"estimate={r.estimate} true={r.true:.4f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4,8,16,32")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    todo: list[CostCase] = list(cases(sizes=tuple(int(s) for s in args.sizes.split(",")),
                                      seeds=tuple(int(s) for s in args.seeds.split(","))))
    with ProcessPoolExecutor(args.jobs) as pool:
        results = [r for batch in pool.map(run_case, todo) for r in batch]
    print(f"{len(todo)} cases")
    for state in ("firing", "resolved"):
        _table(state, [r for r in results if r.state == state])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
