"""The envelope's sensitivity table (issue #45): each physics-envelope parameter at the
low and at the high end of its range (everything else drawn), Vigil's detectors on
the envelope suite's held-out seeds.

    .venv/bin/python bench/bench_envelope.py [--seeds held-out] [--sizes 4] [--jobs 2]
        [--params nccl_channels,util_period] [--classes hang,healthy_moe] [--verbose]
        [--by-step]
    .venv/bin/python bench/bench_envelope.py --check     # a tiny subset, in seconds

Classes and seeds: ``vigil/evaluation/envelope.py``; the ranges and their sources:
``simulator/envelope.py``; the columns: ``vigil/evaluation/sensitivity.py``. The
defaults (3 held-out seeds, 4-node jobs, every parameter and class: 27 rows of 17
scenarios) take 680 s of CPU: 6-13 minutes on the shared 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from vigil_gpu_monitor.simulator.envelope import PARAMETERS
from vigil_gpu_monitor.vigil.evaluation.envelope import CLASSES, HELD_OUT_SEEDS, TUNING_SEEDS
from vigil_gpu_monitor.vigil.evaluation.scenarios import Scenario
from vigil_gpu_monitor.vigil.evaluation.sensitivity import (
    Row,
    by_step_lines,
    markdown,
    rows,
    scenarios,
    score,
    summarise,
)


def _task(task: tuple[Row, Scenario]) -> tuple[Row, dict[str, Any]]:
    row, scenario = task
    return row, score(scenario)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="held-out",
                        help="held-out, tuning, or seeds by number (201,202)")
    parser.add_argument("--sizes", default="4")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--params", default="",
                        help="comma-separated envelope parameters (default: every one)")
    parser.add_argument("--classes", default="", help="comma-separated classes (default: all)")
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="run every scenario this long (default: each its own length)")
    parser.add_argument("--json", default="", help="also write the table here")
    parser.add_argument("--verbose", action="store_true",
                        help="print every false alarm and every missed fault")
    parser.add_argument("--by-step", action="store_true",
                        help="also each faulty class's faults found per job step length")
    parser.add_argument("--check", action="store_true",
                        help="a tiny subset (one seed, two parameters, three classes) that "
                             "must produce a full table")
    args = parser.parse_args(argv)
    named = {"held-out": HELD_OUT_SEEDS, "tuning": TUNING_SEEDS}
    try:
        seeds = named.get(args.seeds) or tuple(int(s) for s in args.seeds.split(","))
        sizes = tuple(int(s) for s in args.sizes.split(","))
    except ValueError:
        parser.error(f"--seeds {args.seeds!r} / --sizes {args.sizes!r}: not numbers")
    params = tuple(filter(None, args.params.split(","))) or PARAMETERS
    wanted = set(filter(None, args.classes.split(",")))
    if args.check:
        seeds, sizes, params = seeds[:1], (4,), ("nccl_channels", "tick")
        wanted = wanted or {"healthy_data_parallel", "hang", "straggler_25"}
    unknown = set(params) - set(PARAMETERS)
    if unknown:
        parser.error(f"unknown parameters: {', '.join(sorted(unknown))}; "
                     f"known: {', '.join(PARAMETERS)}")
    if wanted - {c.name for c in CLASSES}:
        parser.error(f"unknown classes: {', '.join(sorted(wanted - {c.name for c in CLASSES}))}")
    classes = tuple(c for c in CLASSES if not wanted or c.name in wanted)
    plan = rows(params)
    tasks = [(row, dataclasses.replace(sc, duration=args.seconds) if args.seconds else sc)
             for row in plan for sc in scenarios(row, seeds, sizes, classes)]
    began = time.monotonic()
    results: dict[Row, list[dict[str, Any]]] = defaultdict(list)
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for row, result in pool.map(_task, tasks, chunksize=4):
            results[row].append(result)
    table = {row: summarise(results[row], classes) for row in plan}
    print(f"{len(tasks)} scenarios ({len(plan)} rows of {len(tasks) // len(plan)}); seeds "
          f"{seeds}; sizes {sizes}; {time.monotonic() - began:.0f} s wall on {args.jobs} "
          "processes\n")
    print(markdown(table))
    if args.verbose:
        for row in plan:
            for r in results[row]:
                for line in r["false_alarms"]:
                    print(f"  {row[0]}={row[1]} false: {line[:200]}")
                if r["labels"] and r["found"] < r["labels"]:
                    print(f"  {row[0]}={row[1]} missed: {r['name']}")
    if args.by_step:
        print("\nFound per faulty class and job step length (seconds):")
        for row in plan:
            print("\n".join(by_step_lines(row, results[row])))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([{"param": p, "end": e, **s} for (p, e), s in table.items()], fh,
                      indent=2)
    if args.check and not (len(table) == len(plan) == 5
                           and all(s["scenarios"] == len(classes) for s in table.values())):
        print("check failed: the table is incomplete", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
