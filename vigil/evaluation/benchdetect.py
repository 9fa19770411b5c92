"""`vigil bench detect`: precision, recall, F1 and delay per kind on the scenario suite,
for Vigil's detectors and for the static-rules baseline on the same traces."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vigil_gpu_monitor.contracts.codec import DETECTION_KINDS
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Detection
from vigil_gpu_monitor.detectors.baseline import StaticRules
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler, SamplingConfig
from vigil_gpu_monitor.simulator.cluster import (
    FAULT_KINDS,
    JOB_LEVEL_FAULTS,
    NODE_LEVEL_FAULTS,
    Simulator,
)
from vigil_gpu_monitor.vigil.evaluation.scenarios import Scenario, suite

SKEW_TOLERANCE = 10.0  # detections may carry node clocks a few seconds early


def matches(det: Mapping[str, Any], label: dict[str, Any]) -> bool:
    """True when a firing detection (Vigil's, or a static rule's alike) correctly
    reports a ground-truth fault."""
    if det["job"] != label["job"] or det["kind"] not in FAULT_KINDS[label["kind"]]:
        return False
    if det["detected_at"] < label["start"] - SKEW_TOLERANCE:
        return False
    if label["kind"] in JOB_LEVEL_FAULTS:
        return True
    if det["kind"] == "slowdown":  # job-level: right when it names the node first
        candidates = det.get("evidence", {}).get("candidates") or [{}]
        return bool(candidates[0].get("node") == label["node"])
    if det["node"] != label["node"]:
        return False
    return label["kind"] in NODE_LEVEL_FAULTS or det["gpu"] in (label["gpu"], None)


@dataclass
class Tally:
    """Counts for one detector over the suite."""

    labels: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    found: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    delays: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    fired: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    correct: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    healthy_false_alarms: int = 0
    workload: int = 0  # load_imbalance detections (firing and resolved), apart
    # firings of a (kind, node, GPU) beyond its first in a scenario: an incident that
    # resolved and fired again, i.e. a page more for one fault (or one false alarm)
    refired: int = 0
    misses: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)

    def score(self, scenario: Scenario, dets: Sequence[Mapping[str, Any]]) -> None:
        labels = scenario.cluster.labels()
        # load imbalance reports workload, not a fault: it counts neither way
        firing = [d for d in dets if d["state"] == "firing" and d["kind"] != "load_imbalance"]
        self.workload += len(dets) - len([d for d in dets if d["kind"] != "load_imbalance"])
        pages = Counter((d["kind"], d["node"], d["gpu"]) for d in firing)
        self.refired += sum(n - 1 for n in pages.values())
        for det in firing:
            self.fired[det["kind"]] += 1
            if any(matches(det, lab) for lab in labels):
                self.correct[det["kind"]] += 1
            else:
                self.false_alarms.append(f"{scenario.name}: {det['kind']} {det['node']} "
                                         f"{det['gpu']} {det.get('summary', det.get('rule'))}")
                self.healthy_false_alarms += scenario.healthy
        for lab in labels:
            kind = FAULT_KINDS[lab["kind"]][0]
            self.labels[kind] += 1
            hits = [d["detected_at"] - lab["start"] for d in firing if matches(d, lab)]
            if hits:
                self.found[kind] += 1
                self.delays[kind].append(max(0.0, min(hits)))
            else:
                self.misses.append(scenario.name)

    def table(self) -> dict[str, dict[str, float | int | None]]:
        rows: dict[str, dict[str, float | int | None]] = {}
        for kind in (*DETECTION_KINDS, "overall"):
            if kind == "overall":
                labels, found = sum(self.labels.values()), sum(self.found.values())
                fired, correct = sum(self.fired.values()), sum(self.correct.values())
                delays = [d for v in self.delays.values() for d in v]
            else:
                labels, found = self.labels[kind], self.found[kind]
                fired, correct = self.fired[kind], self.correct[kind]
                delays = self.delays[kind]
            recall = found / labels if labels else None
            precision = correct / fired if fired else None
            f1 = (2 * precision * recall / (precision + recall)
                  if precision and recall else 0.0 if labels else None)
            rows[kind] = {"labels": labels, "found": found, "fired": fired,
                          "recall": recall, "precision": precision, "f1": f1,
                          "median_delay": statistics.median(delays) if delays else None,
                          "max_delay": max(delays) if delays else None}
        return rows


def run_suite(scenarios: list[Scenario], cfg: DetectConfig,
              sampling: SamplingConfig | None = None) -> tuple[Tally, Tally, dict[str, float]]:
    """Score Vigil and the baseline on every scenario; also time Vigil's detectors.
    With ``sampling``, Vigil's detectors see what agents with that adaptive sampling
    would publish; the static rules always see every value (a full-rate scrape)."""
    vigil, static = Tally(), Tally()
    samples = 0
    cpu = 0.0
    read = published = 0
    for sc in scenarios:
        runner, rules = ReplayRunner(cfg), StaticRules()
        samplers: dict[str, AdaptiveSampler] = {}
        vigil_dets: list[Detection] = []
        static_dets: list[dict[str, Any]] = []
        for sample in Simulator(sc.cluster, sc.start, seed=sc.seed).samples(sc.duration):
            samples += 1
            seen = sample
            if sampling is not None:
                sampler = samplers.setdefault(sample["node"], AdaptiveSampler(sampling))
                seen = sampler.thin(sample, sample["ts"])
            t0 = time.process_time()
            vigil_dets.extend(runner.feed(seen))
            cpu += time.process_time() - t0
            static_dets.extend(rules.feed(sample))
        read += sum(s.read for s in samplers.values())
        published += sum(s.published for s in samplers.values())
        vigil.score(sc, vigil_dets)
        static.score(sc, static_dets)
    return vigil, static, {"samples": samples, "detector_cpu_seconds": cpu,
                           "values_read": read, "values_published": published}


def _fmt(v: float | int | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if pct else (f"{v:.0f}" if isinstance(v, int) else f"{v:.1f}")


def report(vigil: Tally, static: Tally) -> str:
    """A side-by-side text table."""
    lines = [f"{'kind':14} {'labels':>6} | {'recall':>6} {'prec':>5} {'F1':>5} {'med s':>6} "
             f"{'max s':>6} | {'static':>6} {'prec':>5} {'F1':>5} {'med s':>6}",
             "-" * 86]
    vt, st = vigil.table(), static.table()
    for kind in (*DETECTION_KINDS, "overall"):
        v, s = vt[kind], st[kind]
        lines.append(
            f"{kind:14} {v['labels']:>6} | {_fmt(v['recall'], True):>6} "
            f"{_fmt(v['precision'], True):>5} {_fmt(v['f1'], True):>5} "
            f"{_fmt(v['median_delay']):>6} {_fmt(v['max_delay']):>6} | "
            f"{_fmt(s['recall'], True):>6} {_fmt(s['precision'], True):>5} "
            f"{_fmt(s['f1'], True):>5} {_fmt(s['median_delay']):>6}")
    lines.append(f"false alarms on healthy look-alikes: vigil {vigil.healthy_false_alarms}, "
                 f"static {static.healthy_false_alarms}")
    return "\n".join(lines)


def main(sizes: tuple[int, ...], seeds: tuple[int, ...], json_out: str | None,
         verbose: bool, sampling: SamplingConfig | None = None) -> int:
    """Run the suite, print the table (and misses / false alarms with --verbose)."""
    scenarios = suite(sizes=sizes, seeds=seeds)
    started = time.monotonic()
    vigil, static, cost = run_suite(scenarios, DetectConfig(), sampling)
    print(f"{len(scenarios)} scenarios ({sum(s.healthy for s in scenarios)} healthy), "
          f"{cost['samples']} node-samples, {time.monotonic() - started:.0f}s wall, "
          f"detectors {cost['detector_cpu_seconds']:.1f} CPU-s "
          f"({cost['detector_cpu_seconds'] / max(1, cost['samples']) * 1e6:.0f} µs/sample)")
    if sampling is not None:
        print(f"vigil saw adaptively sampled values: {cost['values_read']} read, "
              f"{cost['values_published']} published "
              f"({cost['values_read'] / max(1, cost['values_published']):.1f}x fewer); "
              "the static rules saw every value")
    print(report(vigil, static))
    if verbose:
        for what, items in (("missed", vigil.misses), ("false alarm", vigil.false_alarms)):
            for item in items:
                print(f"  {what}: {item}")
    if json_out:
        with open(json_out, "w") as fh:
            json.dump({"vigil": vigil.table(), "static": static.table(), "cost": cost,
                       "misses": vigil.misses, "false_alarms": vigil.false_alarms}, fh, indent=2)
    return 0
