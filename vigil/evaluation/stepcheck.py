"""Issue #47's checks of detection from step timings, on the simulator's seeds.

Each case builds one job with one known condition, streams its per-rank timings
(``simulator/steps.py``) and, with ``counters=True``, its samples too, through the
same engine as the worker (``ReplayRunner``), and judges what fired:

- ``slow_rank``: a GPU 10 % slow (a stall: no clock change, no flag) is a straggler
  at that node and GPU within 2 min;
- ``cpu_stall_rank`` / ``cpu_stall_node``: a rank's / a node's host delays it (its
  GPUs idle meanwhile) is a straggler with ``remediable: false``;
- ``stage_imbalance``: a pipeline whose last stage has more work is
  ``load_imbalance`` naming that stage, and nothing else;
- ``seq_noise``: step-to-step sequence-length variation (σ 20 %) raises nothing;
- ``cost_straggler``, ``cost_node``, ``cost_network``: the incident's cost (its
  resolved message: the median while open) is within ±10 % of the simulator's
  truth over the fault, a straggler's from its what-if, a network fault's from the
  job's measured step (a timing ``slowdown``, or the link finding it explains).

With counters, the fault must also be one incident, not one per view.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Detection
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.simulator.steps import StepTimings

T0 = 1_700_000_000.0
ONSET = 120.0
COST_ONSET = 300.0  # a cost is measured against 5 min of the job's healthy steps
FIND_WITHIN = 120.0  # seconds: the bar for a 10 % slow rank
COST_TOLERANCE = 0.10  # relative: the bar for a slowdown's cost
CASES = ("slow_rank", "cpu_stall_rank", "cpu_stall_node", "stage_imbalance", "seq_noise",
         "cost_straggler", "cost_node", "cost_network")


@dataclass
class CaseResult:
    """What one case fired and whether it passed, with its figures."""

    case: str
    seed: int
    counters: bool
    passed: bool
    why: str
    firing: list[Detection] = field(default_factory=list)
    delay: float | None = None  # seconds from onset to the first right detection
    cost: float | None = None
    truth: float | None = None


def _build(case: str, seed: int) -> tuple[Cluster, float, float, Fault | None]:
    """The case's cluster, its sequence-length σ, its duration, its fault."""
    rng = random.Random(f"{seed}-{case}")
    nodes = [f"gpu-node-{i:02d}" for i in range(rng.choice((4, 6, 8)))]
    node, gpu = rng.choice(nodes), str(rng.randrange(8))
    step = rng.choice((0.5, 1.0, 2.0))
    job = JobSpec("job-steps", nodes, compute_seconds=0.8 * step, comm_seconds=0.2 * step)
    end = T0 + COST_ONSET + 300.0
    fault: Fault | None = {
        "slow_rank": Fault("slow_gpu_quiet", job.name, node, gpu, T0 + ONSET, severity=1.1),
        "cpu_stall_rank": Fault("slow_host", job.name, node, gpu, T0 + ONSET, severity=1.15),
        "cpu_stall_node": Fault("slow_host", job.name, node, None, T0 + ONSET, severity=1.2),
        "cost_straggler": Fault("slow_gpu_quiet", job.name, node, gpu, T0 + COST_ONSET, end,
                                1.3),
        "cost_node": Fault("slow_host", job.name, node, None, T0 + COST_ONSET, end, 1.25),
        "cost_network": Fault("nic_degraded", job.name, node, None, T0 + COST_ONSET, end),
    }.get(case)
    if case == "stage_imbalance":
        job = JobSpec("job-steps", [f"gpu-node-{i:02d}" for i in range(8)], kind="pipeline",
                      stages=4, compute_seconds=0.8 * step, comm_seconds=0.2 * step)
    sigma = 0.2 if case == "seq_noise" else 0.05
    duration = COST_ONSET + 420.0 if case.startswith("cost") else ONSET + 300.0
    return Cluster([job], [fault] if fault else []), sigma, duration, fault


def simulate(case: str, seed: int, counters: bool) -> tuple[list[Detection], Simulator]:
    """Every detection of the case's run, and the simulator (its truth)."""
    cluster, sigma, duration, _ = _build(case, seed)
    sim = Simulator(cluster, T0, seed=seed)
    timings = StepTimings(seed=seed, seq_sigma=sigma)
    sim.step_timings = timings
    runner = ReplayRunner(DetectConfig())
    out: list[Detection] = []
    for sample in sim.samples(duration):
        if counters:
            out.extend(runner.feed(sample))
        for batch in timings.drain():
            out.extend(runner.feed_steps(batch))
    return out, sim


def _truth(sim: Simulator, fault: Fault) -> float:
    """The fault's mean slowdown of the job's steps while it was on."""
    values = [x - 1 for t, x in sim.truth["job-steps"] if fault.active(t)]
    return statistics.fmean(values)


def check(case: str, seed: int, counters: bool = False) -> CaseResult:
    """Run one case and judge it."""
    detections, sim = simulate(case, seed, counters)
    _, _, _, fault = _build(case, seed)
    firing = [d for d in detections if d["state"] == "firing"]
    result = CaseResult(case, seed, counters, False, "", firing)
    faults = [d for d in firing if d["kind"] != "load_imbalance" or case == "stage_imbalance"]
    if case == "seq_noise":
        result.passed = not faults
        result.why = "nothing fired" if not faults else f"{len(faults)} detections"
        return result
    if case == "stage_imbalance":
        stage = [d for d in firing if d["kind"] == "load_imbalance"
                 and d["evidence"].get("stage") == 3]
        others = [d for d in firing if d["kind"] in ("straggler", "slowdown")]
        result.passed = bool(stage) and not others
        result.why = f"stage 3 load_imbalance: {bool(stage)}, stragglers/slowdowns: {len(others)}"
        return result
    assert fault is not None
    if case.startswith("cost"):
        return _judge_cost(result, detections, sim, fault)
    right = [d for d in faults if d["kind"] == "straggler" and d["node"] == fault.node
             and (fault.gpu is None or d["gpu"] in (None, fault.gpu))]
    wrong = [d for d in faults if d not in right and d["kind"] in ("straggler", "slowdown")]
    if not right:
        result.why = f"not found; fired: {[(d['kind'], d['node'], d['gpu']) for d in faults]}"
        return result
    first = right[0]
    result.delay = first["detected_at"] - fault.start
    where_ok = first["gpu"] == fault.gpu if case == "slow_rank" else True
    remediable_ok = case == "slow_rank" or first["evidence"].get("remediable") is False
    one = len({d["id"] for d in right}) == 1
    result.passed = (where_ok and remediable_ok and one and not wrong
                     and (case != "slow_rank" or result.delay <= FIND_WITHIN))
    ev = first["evidence"]
    result.why = (f"{first['node']} GPU {first['gpu']} in {result.delay:.0f} s, remediable "
                  f"{ev.get('remediable')}, incidents {len({d['id'] for d in right})}, "
                  f"others {len(wrong)}, sources {ev.get('sources')}, agree {ev.get('agree')}")
    return result


def _judge_cost(result: CaseResult, detections: list[Detection], sim: Simulator,
                fault: Fault) -> CaseResult:
    resolved = [d for d in detections if d["state"] == "resolved"
                and d["kind"] != "load_imbalance"
                and d["evidence"].get("cost_basis") == "steps"]
    result.truth = _truth(sim, fault)
    if not resolved:
        fired = [(d["kind"], d["node"], d["evidence"].get("cost_basis")) for d in result.firing]
        result.why = f"no incident with a measured cost; fired: {fired}"
        return result
    ev: dict[str, Any] = resolved[0]["evidence"]
    result.cost = float(ev["job_slowdown"])
    error = abs(result.cost - result.truth) / result.truth
    result.passed = error <= COST_TOLERANCE and len(resolved) == 1
    result.why = (f"{resolved[0]['kind']} costs {result.cost:.3f} vs truth {result.truth:.3f} "
                  f"({error:+.1%} off), {len(resolved)} costed incident(s)")
    return result
