"""Detection on held-out job physics (issue #14): per class, on the tuning seeds and on
the held-out seeds apart, Vigil beside the static rules.

    .venv/bin/python bench/bench_physics.py [--sizes 4,16] [--jobs 2] [--seeds held-out]
        [--classes quiet_25,degraded_at_start] [--delays]

Classes and seeds: ``vigil/evaluation/physics.py``. Per class: faults found (on the
right GPU or node), detection delay p50 / p90 from onset, and false alarms (any
firing detection no fault explains; on a healthy class every one is false).
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.vigil.evaluation.benchdetect import Tally, run_suite
from vigil_gpu_monitor.vigil.evaluation.physics import (
    CLASSES,
    HELD_OUT_SEEDS,
    TUNING_SEEDS,
    physics_suite,
)
from vigil_gpu_monitor.vigil.evaluation.scenarios import Scenario


def _score(scenario: Scenario) -> tuple[str, int, dict[str, Any]]:
    vigil, static, _ = run_suite([scenario], DetectConfig())
    return scenario.name, scenario.seed, {"vigil": _summary(vigil), "static": _summary(static)}


def _summary(t: Tally) -> dict[str, Any]:
    delays = [d for v in t.delays.values() for d in v]
    return {"labels": sum(t.labels.values()), "found": sum(t.found.values()),
            "delays": delays, "false": len(t.false_alarms),
            "false_kinds": {k: n - t.correct[k] for k, n in t.fired.items()
                            if n > t.correct[k]}}


SPLITS = ("tuning", "held-out", "fresh")


def _split(seed: int) -> str:
    """Which set a seed belongs to ("fresh": neither, never run before)."""
    return "tuning" if seed in TUNING_SEEDS else "held-out" if seed in HELD_OUT_SEEDS \
        else "fresh"


def _pct(values: list[float], q: float) -> str:
    if not values:
        return "–"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4,16")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", default="all",
                        help="all, tuning, held-out, or seeds by number (1,2 or 71,72,73: "
                             "seeds in neither set are reported as 'fresh'); the tuning "
                             "seeds are many: held-out alone takes a sixth of the time")
    parser.add_argument("--classes", default="",
                        help="comma-separated class names (default: every class)")
    parser.add_argument("--delays", action="store_true",
                        help="also print every fault's delay, per class and split")
    args = parser.parse_args()
    sizes = tuple(int(s) for s in args.sizes.split(","))
    named = {"all": TUNING_SEEDS + HELD_OUT_SEEDS, "tuning": TUNING_SEEDS,
             "held-out": HELD_OUT_SEEDS}
    try:
        seeds = named.get(args.seeds) or tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is neither a split nor numbers")
    wanted = set(filter(None, args.classes.split(",")))
    unknown = wanted - {c.name for c in CLASSES}
    if unknown:
        parser.error(f"unknown classes: {', '.join(sorted(unknown))}")
    classes = tuple(c for c in CLASSES if not wanted or c.name in wanted)
    scenarios = physics_suite(seeds, sizes, classes)
    splits = [s for s in SPLITS if s in {_split(seed) for seed in seeds}]
    with ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(_score, scenarios))
    table: dict[tuple[str, str], dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "labels": 0, "found": 0, "delays": [], "false": 0, "s_found": 0,
                 "s_delays": [], "s_false": 0})
    for name, seed, r in results:
        class_name = name.rsplit("-", 2)[0]
        split = _split(seed)
        row = table[(class_name, split)]
        row["n"] += 1
        for key in ("labels", "found", "delays", "false"):
            row[key] += r["vigil"][key]
        row["s_found"] += r["static"]["found"]
        row["s_delays"] += r["static"]["delays"]
        row["s_false"] += r["static"]["false"]
    print(f"{len(scenarios)} scenarios; sizes {sizes}; tuning seeds {TUNING_SEEDS}, "
          f"held-out seeds {HELD_OUT_SEEDS}")
    print("| class | effect | seeds | jobs | found | delay p50 / p90 s | false alarms | "
          "static: found | static delay p50 | static false |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cls in classes:
        for split in splits:
            row = table[(cls.name, split)]
            if not row["n"]:
                continue
            found = f"{row['found']}/{row['labels']}" if row["labels"] else "(healthy)"
            s_found = f"{row['s_found']}/{row['labels']}" if row["labels"] else "–"
            print(f"| {cls.name} | {cls.effect or 'healthy'} | {split} | {row['n']} | {found} "
                  f"| {_pct(row['delays'], 0.5)} / {_pct(row['delays'], 0.9)} | {row['false']} "
                  f"| {s_found} | {_pct(row['s_delays'], 0.5)} | {row['s_false']} |")
    print("\nBy effect size (faults only):\n")
    print("| effect | seeds | found | delay p50 / p90 s | static: found | static delay p50 |")
    print("|---|---|---|---|---|---|")
    effects = sorted({c.effect for c in classes if c.effect})
    for effect in effects:
        for split in splits:
            rows = [table[(c.name, split)] for c in classes if c.effect == effect]
            delays = [d for r in rows for d in r["delays"]]
            s_delays = [d for r in rows for d in r["s_delays"]]
            labels = sum(r["labels"] for r in rows)
            print(f"| {effect} | {split} | {sum(r['found'] for r in rows)}/{labels} "
                  f"| {_pct(delays, 0.5)} / {_pct(delays, 0.9)} "
                  f"| {sum(r['s_found'] for r in rows)}/{labels} | {_pct(s_delays, 0.5)} |")
    for split in splits:
        rows = [r for (c, s), r in table.items() if s == split]
        healthy = [table[(c.name, split)] for c in classes if not c.effect]
        labels = sum(r["labels"] for r in rows)
        kinds: Counter[str] = Counter()
        for _, seed, r in results:
            if _split(seed) == split:
                kinds.update(r["vigil"]["false_kinds"])
        print(f"\n{split}: {sum(r['found'] for r in rows)}/{labels} faults found, "
              f"{sum(r['false'] for r in rows)} false alarms "
              f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'}) "
              f"({sum(r['false'] for r in healthy)} on {sum(r['n'] for r in healthy)} "
              f"healthy look-alike jobs); median delay "
              f"{statistics.median([d for r in rows for d in r['delays']] or [0]):.0f} s")
    if args.delays:
        print("\nEvery fault's delay, s:\n")
        for (cls_name, split), row in sorted(table.items()):
            if row["labels"]:
                print(f"{cls_name} {split}: {sorted(round(d) for d in row['delays'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
