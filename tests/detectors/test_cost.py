"""Cost estimates in detections, against the simulator's truth."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from vigil_gpu_monitor.contracts.codec import validate_detection
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.detectors.cost import (
    DUTY_WAIT_BINS,
    ESTIMATE_BINS,
    MAX_BASE_NODES,
    _baseline,
    _from_baseline,
    inflation_series,
    job_duty_metric,
)
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.simulator.cluster import Cluster, Event, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.evaluation.costcheck import CostCase, run_case, true_slowdown

START = 1_700_000_000.0


@pytest.mark.parametrize("case", [
    CostCase("data_parallel", 8, "slow_gpu", 1.2, 7),
    CostCase("pipeline", 8, "slow_node", 1.4, 7),
    CostCase("moe", 8, "slow_gpu", 1.6, 7),
    CostCase("data_parallel", 4, "nvlink_degraded", 0.0, 7),
    CostCase("moe", 4, "network_phase", 0.0, 7),
], ids=lambda c: c.name)
def test_estimate_is_within_a_quarter_of_the_truth(case: CostCase) -> None:
    results = run_case(case)
    assert {r.state for r in results} == {"firing", "resolved"}, results
    for r in results:
        assert r.basis == "baseline" and r.estimate is not None
        assert r.true > 0.02, r  # each of these faults slows its job measurably
        assert abs(r.estimate - r.true) <= 0.25 * r.true, r


def test_hang_costs_the_whole_job() -> None:
    results = run_case(CostCase("data_parallel", 4, "hang", 0.0, 7))
    assert [r.state for r in results] == ["firing", "resolved"]
    for r in results:
        assert math.isinf(r.true) and r.basis == "hang" and r.estimate is None
        assert r.lost_per_hour == 32.0  # 4 nodes × 8 GPUs


def test_fields_are_consistent_and_resolved_carries_the_incidents_cost() -> None:
    job = JobSpec("j", [f"n{i}" for i in range(6)], events=[Event("warmup", START, START + 30)])
    fault = Fault("slow_gpu", "j", "n2", "4", START + 90, START + 200, severity=1.3)
    runner = ReplayRunner(DetectConfig())
    dets = [d for s in Simulator(Cluster([job], [fault]), START, seed=3).samples(320)
            for d in runner.feed(s)]
    firing = [d for d in dets if d["kind"] == "straggler" and d["state"] == "firing"]
    resolved = [d for d in dets if d["kind"] == "straggler" and d["state"] == "resolved"]
    assert len(firing) == 1 and len(resolved) == 1, dets
    for det in (firing[0], resolved[0]):
        ev = validate_detection(det)["evidence"]
        assert ev["job_gpus"] == 48 and ev["cost_basis"] == "baseline"
        s = ev["job_slowdown"]
        assert ev["gpu_hours_lost_per_hour"] == pytest.approx(48 * s / (1 + s), abs=2e-3)
    # The resolved message speaks for the whole incident, not for its first seconds.
    sim_truth = true_slowdown(_truth(job, fault), fault.start, fault.end - 1)
    assert abs(resolved[0]["evidence"]["job_slowdown"] - sim_truth) <= 0.25 * sim_truth


def _truth(job: JobSpec, fault: Fault) -> list[tuple[float, float]]:
    sim = Simulator(Cluster([job], [fault]), START, seed=3)
    for _ in sim.samples(320):
        pass
    return sim.truth["j"]


def test_a_fault_older_than_the_history_falls_back_to_the_blamed_gpu() -> None:
    job = JobSpec("j", [f"n{i}" for i in range(4)])
    fault = Fault("slow_gpu", "j", "n1", "2", START, severity=1.4)  # slow from the start
    runner = ReplayRunner(DetectConfig())
    firing = [d for s in Simulator(Cluster([job], [fault]), START, seed=5).samples(150)
              for d in runner.feed(s) if d["state"] == "firing"]
    assert [d["node"] for d in firing] == ["n1"], firing
    ev = firing[0]["evidence"]
    assert ev["cost_basis"] == "blamed"
    # an upper bound: at least the truth, and not absurdly above it
    assert 0.28 <= ev["job_slowdown"] <= 0.45, ev


def test_codec_refuses_a_negative_or_mistyped_cost() -> None:
    base: dict[str, Any] = {
        "schema": "vigil.detection/1", "id": "x", "kind": "straggler", "state": "firing",
        "severity": "warning", "job": "j", "node": "n", "gpu": "1", "started_at": 1.0,
        "detected_at": 2.0, "metrics": [], "score": 1.0, "summary": "s",
        "evidence": {"job_slowdown": 0.1, "job_gpus": 8, "gpu_hours_lost_per_hour": 0.73,
                     "cost_basis": "baseline"}}
    validate_detection(base)
    validate_detection({**base, "evidence": {"job_slowdown": None, "cost_basis": "none",
                                             "gpu_hours_lost_per_hour": None, "job_gpus": 8}})
    for bad in ({"job_slowdown": -0.1}, {"gpu_hours_lost_per_hour": "7"}, {"job_gpus": 1.5},
                {"job_gpus": True}, {"cost_basis": "guess"}):
        with pytest.raises(ContractError):
            validate_detection({**base, "evidence": {**base["evidence"], **bad}})


def test_inflation_series_reads_pauses_as_gaps() -> None:
    levels = np.array([0.40, 0.40, 0.40, 0.01, 0.40, 0.32, 0.32, np.nan])
    series = inflation_series(levels)
    assert series[0] == 0.0 and series[5] == pytest.approx(0.25)
    assert np.isnan(series[3]) and np.isnan(series[7])


def _history(levels: dict[str, list[float]], first: int = 0) -> list[list[Any]]:
    """The cost memory's ``[bin, {node: level}]`` from each node's levels per bin."""
    bins = len(next(iter(levels.values())))
    return [[first + b, {n: v[b] for n, v in levels.items()}] for b in range(bins)]


def test_each_node_is_read_against_its_own_healthy_level() -> None:
    # A pipeline: two stage levels. The step grows 10 % from bin 20 on, and the job's
    # level beats ±3 % from bin to bin (a 5 s bin holds a fraction of a step that
    # changes); a pause (bins 4-6) and the onset's own bin (half slowed) read low.
    beat = [1.03 if b % 2 else 0.97 for b in range(40)]
    step = [1.0 if b < 20 else (1.05 if b == 20 else 1.1) for b in range(40)]
    pause = [0.01 if 4 <= b <= 6 else 1.0 for b in range(40)]
    nodes = {f"n{i}": [(0.365 if i % 4 == 3 else 0.30) * beat[b] * pause[b] / step[b]
                       for b in range(40)] for i in range(8)}
    nodes["n1"] = [v * (1.4 if b >= 20 else 1.0) for b, v in enumerate(nodes["n1"])]
    history = _history(nodes)
    finding = Finding("straggler", "n1", None, "warning", (), 1.0, "", since=100.0)
    entry = _baseline(finding, 20, history[:21])
    assert entry["basis"] == "baseline" and "n1" not in entry["nodes"]
    assert entry["nodes"]["n3"] == pytest.approx(0.365, rel=0.04)  # its own stage's level
    # two bins in: the onset's bin is left out; the other one is read as it beats
    assert _from_baseline(entry, history[:22]) == pytest.approx(1.1 / 1.03 - 1)
    # a minute in: the beat averages out (an even number of bins here)
    assert _from_baseline(entry, history[:33]) == pytest.approx(0.1, rel=0.01)
    assert len(entry["ratios"]) <= ESTIMATE_BINS


def test_a_bin_of_pause_is_skipped_and_the_state_is_bounded() -> None:
    nodes = {f"n{i:03d}": [0.3] * 20 + [0.3 / 1.2, 0.005, 0.3 / 1.2] for i in range(200)}
    history = _history(nodes)
    finding = Finding("straggler", "n007", "3", "warning", (), 1.0, "", since=100.0)
    entry = _baseline(finding, 20, history[:21])
    assert len(entry["nodes"]) == MAX_BASE_NODES
    assert _from_baseline(entry, history) == pytest.approx(0.2)


def test_no_healthy_bins_before_the_onset_falls_back() -> None:
    history = _history({"a": [0.3] * 3, "b": [0.3] * 3})
    gpu = Finding("straggler", "a", "1", "warning", (), 1.0, "", since=0.0)
    link = Finding("link_health", "a", None, "warning", (), 1.0, "", since=0.0)
    assert _baseline(gpu, 1, history)["basis"] == "blamed"
    assert _baseline(link, 1, history)["basis"] == "none"


def test_the_jobs_duty_counter_is_not_chosen_from_a_warm_up_bin() -> None:
    """Tensor activity 0.018 in a job's first bin (its warm-up) must not make SM
    activity its counter for good (fleet soak: two false slowdowns on a 10 s-step
    MoE job): tensor activity is waited for, and taken once it shows; a job that
    never shows it falls back after ``DUTY_WAIT_BINS``; an exporter without the
    field gets the next counter at once."""
    def series(tensor: float | None) -> Any:
        readings = {"tensor_active": np.full(4, np.nan if tensor is None else tensor),
                    "sm_active": np.full(4, 0.4)}
        return readings.__getitem__

    memory: dict[str, Any] = {}
    assert job_duty_metric(series(0.018), memory) is None
    assert job_duty_metric(series(0.45), memory) == "tensor_active"
    assert job_duty_metric(series(0.001), memory) == "tensor_active"  # kept
    idle: dict[str, Any] = {}
    chosen = [job_duty_metric(series(0.0), idle) for _ in range(DUTY_WAIT_BINS)]
    assert chosen[:-1] == [None] * (DUTY_WAIT_BINS - 1) and chosen[-1] == "sm_active"
    assert job_duty_metric(series(None), {}) == "sm_active"
