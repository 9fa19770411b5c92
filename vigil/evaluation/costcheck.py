"""How close Vigil's cost estimates come to the simulator's known truth.

For each case (a job type, size, fault kind and fault size) one job is simulated
with a warm-up and a checkpoint before the fault, replayed through the detectors,
and every firing detection that correctly reports the fault is paired with the
simulator's true step-time inflation over the span its estimate reads (from the
fault's start to the detection, at most the ``ESTIMATE_BINS`` before it).
``bench/bench_cost.py`` prints the error distribution.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.cost import ESTIMATE_BINS
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Event, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.evaluation.benchdetect import matches

START = 1_800_000_000.0
FAULT_AT = 120.0
FAULT_SECONDS = 180.0  # then it ends, and its incident resolves
DURATION = 360.0
SIZED_FAULTS = ("slow_gpu", "slow_node")
FIXED_FAULTS = ("thermal", "nvlink_degraded", "nic_degraded", "network_phase", "hang")
SEVERITIES = (1.05, 1.1, 1.2, 1.4, 1.6)
# the span an estimate speaks for: the fault's bins, up to ``detectors.cost.ESTIMATE_BINS``
TRUTH_SECONDS = ESTIMATE_BINS * DetectConfig().bin_seconds


@dataclass(frozen=True)
class CostCase:
    """One simulated job with one fault."""

    job_type: str
    nodes: int
    fault: str
    severity: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.job_type}-{self.nodes}n-{self.fault}-x{self.severity:g}-s{self.seed}"


@dataclass(frozen=True)
class CostResult:
    """One detection's estimate beside the truth (``true`` is inf for a hang)."""

    case: CostCase
    state: str  # firing: the estimate then, against the truth so far; resolved: the
    # incident's median estimate, against the truth over the whole fault
    kind: str
    basis: str
    estimate: float | None  # job_slowdown as published
    true: float
    lost_per_hour: float | None
    delay: float

    @property
    def relative_error(self) -> float | None:
        """(estimate − truth) / truth of the slowdown; 0 for a hang costed as a hang."""
        if math.isinf(self.true):
            return 0.0 if self.basis == "hang" else None
        if self.estimate is None or self.true <= 0:
            return None
        return (self.estimate - self.true) / self.true


def cases(job_types: tuple[str, ...] = ("data_parallel", "pipeline", "moe"),
          sizes: tuple[int, ...] = (4, 8, 16), seeds: tuple[int, ...] = (1, 2),
          severities: tuple[float, ...] = SEVERITIES) -> Iterator[CostCase]:
    """Every combination; fixed-size faults once, network phases on MoE only."""
    for seed in seeds:
        for job_type in job_types:
            for nodes in sizes:
                for fault in SIZED_FAULTS:
                    for severity in severities:
                        yield CostCase(job_type, nodes, fault, severity, seed)
                for fault in FIXED_FAULTS:
                    if fault != "network_phase" or job_type == "moe":
                        yield CostCase(job_type, nodes, fault, 0.0, seed)


def cluster_of(case: CostCase) -> Cluster:
    """The case's job, its healthy phases (warm-up, a checkpoint) and its fault."""
    rng = random.Random(case.name)
    job = JobSpec(case.name, [f"node-{i:03d}" for i in range(case.nodes)], kind=case.job_type,
                  events=[Event("warmup", START, START + 40),
                          Event("checkpoint", START + 60, START + 80)])
    node, gpu = rng.choice(job.nodes), str(rng.randrange(job.gpus_per_node))
    at = START + FAULT_AT
    end = at + FAULT_SECONDS
    if case.fault in ("hang", "network_phase"):
        fault = Fault(case.fault, job.name, None, None, at, end)
    elif case.fault in ("slow_node", "nic_degraded"):
        fault = Fault(case.fault, job.name, node, None, at, end, severity=case.severity or 1.25)
    else:
        fault = Fault(case.fault, job.name, node, gpu, at, end, severity=case.severity or 1.3)
    return Cluster([job], [fault], skew_seconds=1.0, loss=0.01, reorder_seconds=1.0)


def true_slowdown(truth: list[tuple[float, float]], fault_start: float, at: float,
                  seconds: float = TRUTH_SECONDS) -> float:
    """What the fault costs at ``at``: over the ``seconds`` before it (while the fault
    is active), the steady slowdown that loses the same goodput, i.e.
    ``1 / mean(T_healthy / T) − 1`` (inf for a hang; nan if nothing is active)."""
    span = [r for t, r in truth if max(fault_start, at - seconds) <= t <= at]
    if not span:
        return math.nan
    if any(math.isinf(r) for r in span):
        return math.inf
    return 1.0 / statistics.fmean(1.0 / r for r in span) - 1.0


def run_case(case: CostCase, cfg: DetectConfig | None = None) -> list[CostResult]:
    """Replay one case; one result per firing or resolved detection that reports its
    fault (a firing one fired before the fault ended)."""
    cluster = cluster_of(case)
    sim = Simulator(cluster, START, seed=case.seed)
    runner = ReplayRunner(cfg or DetectConfig())
    published = [d for s in sim.samples(DURATION) for d in runner.feed(s)]
    label = cluster.labels()[0]
    truth = sim.truth[case.name]
    out = []
    for det in published:
        if not matches(det, label) or "cost_basis" not in det["evidence"]:
            continue
        if det["state"] == "firing" and det["detected_at"] < label["end"]:
            true = true_slowdown(truth, label["start"], det["detected_at"])
        elif det["state"] == "resolved":
            true = true_slowdown(truth, label["start"], label["end"], FAULT_SECONDS)
        else:
            continue
        ev = det["evidence"]
        out.append(CostResult(case, det["state"], det["kind"], ev["cost_basis"],
                              ev["job_slowdown"], true, ev["gpu_hours_lost_per_hour"],
                              det["detected_at"] - label["start"]))
    return out
