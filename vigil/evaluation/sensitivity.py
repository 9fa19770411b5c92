"""The envelope's sensitivity table (issue #45): for each parameter of the physics
envelope, held at the low and at the high end of its range with everything else
drawn, what the detectors find and what they raise on healthy jobs.

A row per (parameter, end), plus one with everything drawn. Columns: faults found
(on the right GPU or node) and their median delay; hangs found within 20 s; 8-15 %
slow GPUs found within 4 minutes; false alarms on healthy jobs by kind (straggler,
hang and slowdown apart: the issue allows none); wrong detections on faulty jobs;
whether the power-capped hot expert was reported as ``load_imbalance``; the firing
detections a node's power brake raised (one incident is one); and how often a
finding fired again after it had resolved, over every scenario of the row (each is
one more page for the same fault or false alarm).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.simulator.envelope import PARAMETERS, RANGES
from vigil_gpu_monitor.vigil.evaluation.benchdetect import run_suite
from vigil_gpu_monitor.vigil.evaluation.envelope import (
    CLASSES,
    HOT_EXPERT,
    EnvelopeClass,
    envelope_suite,
)
from vigil_gpu_monitor.vigil.evaluation.scenarios import Scenario

BARRIER_KINDS = ("straggler", "hang", "slowdown")
HANG_WITHIN = 20.0
SMALL_WITHIN = 240.0
Row = tuple[str, str]  # (parameter or "all", "low" | "high" | "drawn")


def rows(params: Iterable[str] = PARAMETERS) -> list[Row]:
    """The table's rows: everything drawn, then each parameter at each end."""
    return [("all", "drawn")] + [(p, end) for p in params for end in ("low", "high")]


def scenarios(row: Row, seeds: tuple[int, ...], sizes: tuple[int, ...],
              classes: tuple[EnvelopeClass, ...] = CLASSES) -> list[Scenario]:
    """The suite for one row: its parameter pinned at its end, the rest drawn."""
    pins = {} if row[0] == "all" else {row[0]: row[1]}
    return envelope_suite(seeds, sizes, classes, pins)


def score(scenario: Scenario) -> dict[str, Any]:
    """One scenario through Vigil's detectors, summed up for the table."""
    vigil, _, _ = run_suite([scenario], DetectConfig())
    false = Counter({k: n - vigil.correct[k] for k, n in vigil.fired.items()
                     if n > vigil.correct[k]})
    job = scenario.cluster.jobs[0]
    return {"name": scenario.name, "class": scenario.name.rsplit("-", 2)[0],
            "step_seconds": round(job.compute_seconds + job.comm_seconds, 2),
            "healthy": scenario.healthy, "labels": sum(vigil.labels.values()),
            "found": sum(vigil.found.values()),
            "delays": [d for v in vigil.delays.values() for d in v],
            "false": dict(false), "fired": sum(vigil.fired.values()),
            "workload": vigil.workload, "refired": vigil.refired,
            "false_alarms": list(vigil.false_alarms)}


def summarise(results: list[dict[str, Any]],
              classes: tuple[EnvelopeClass, ...] = CLASSES) -> dict[str, Any]:
    """One row's figures from its scenarios' scores."""
    effect = {c.name: c.effect for c in classes}
    faulty = [r for r in results if not r["healthy"]]
    delays = [d for r in faulty for d in r["delays"]]
    hangs = [r for r in faulty if effect.get(r["class"]) == "hang"]
    small = [r for r in faulty if effect.get(r["class"]) == "8–15 %"]
    healthy_false: Counter[str] = Counter()
    for r in results:
        if r["healthy"]:
            healthy_false.update(r["false"])
    hot = [r for r in results if r["class"] == HOT_EXPERT]
    brakes = [r for r in faulty if r["class"] == "power_brake"]
    return {
        "scenarios": len(results), "labels": sum(r["labels"] for r in faulty),
        "found": sum(r["found"] for r in faulty),
        "median_delay": statistics.median(delays) if delays else None,
        "hangs": len(hangs),
        "hangs_in_time": sum(any(d <= HANG_WITHIN for d in r["delays"]) for r in hangs),
        "small": len(small),
        "small_in_time": sum(any(d <= SMALL_WITHIN for d in r["delays"]) for r in small),
        "healthy_false": {k: healthy_false.get(k, 0) for k in BARRIER_KINDS}
        | {"other": sum(n for k, n in healthy_false.items() if k not in BARRIER_KINDS)},
        "faulty_false": sum(sum(r["false"].values()) for r in faulty),
        "hot_expert": len(hot), "hot_expert_load": sum(r["workload"] > 0 for r in hot),
        "brakes": len(brakes), "brake_detections": sum(r["fired"] for r in brakes),
        "refired": sum(r["refired"] for r in results),
    }


def by_step(results: list[dict[str, Any]]) -> dict[str, dict[float, tuple[int, int]]]:
    """Faults found and faults, per faulty class and the job's healthy step length
    (seconds): what a row's one figure hides where recall depends on how a step
    compares with a bin (a host-bound node of a 10 s-step job, say)."""
    out: dict[str, dict[float, tuple[int, int]]] = {}
    for r in results:
        if r["healthy"] or not r["labels"]:
            continue
        per = out.setdefault(r["class"], {})
        found, labels = per.get(r["step_seconds"], (0, 0))
        per[r["step_seconds"]] = (found + r["found"], labels + r["labels"])
    return {name: dict(sorted(steps.items())) for name, steps in sorted(out.items())}


def by_step_lines(row: Row, results: list[dict[str, Any]]) -> list[str]:
    """``by_step`` as one line per faulty class (``10 s 0/14``), shortest step first."""
    return [f"  {row[0]}={row[1]} {name} by step: " + ", ".join(
                f"{step:g} s {found}/{labels}" for step, (found, labels) in steps.items())
            for name, steps in by_step(results).items()]


def _value(row: Row) -> str:
    if row[0] == "all":
        return "drawn"
    low, high = RANGES[row[0]]
    value = low if row[1] == "low" else high
    return f"{value:.3g}"


def _delay(v: float | None) -> str:
    return "–" if v is None else f"{v:.0f}"


def markdown(table: Mapping[Row, Mapping[str, Any]]) -> str:
    """The table as markdown, one line per row."""
    lines = ["| parameter | end | value | found | median delay s | hangs ≤ 20 s | "
             "8–15 % ≤ 4 min | healthy: straggler | hang | slowdown | other | "
             "wrong on faulty | hot expert → load | brake detections | fired again |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row, s in table.items():
        f = s["healthy_false"]
        lines.append(
            f"| {row[0]} | {row[1]} | {_value(row)} | {s['found']}/{s['labels']} | "
            f"{_delay(s['median_delay'])} | {s['hangs_in_time']}/{s['hangs']} | "
            f"{s['small_in_time']}/{s['small']} | {f['straggler']} | {f['hang']} | "
            f"{f['slowdown']} | {f['other']} | {s['faulty_false']} | "
            f"{s['hot_expert_load']}/{s['hot_expert']} | "
            f"{s['brake_detections']}/{s['brakes']} | {s['refired']} |")
    return "\n".join(lines)
