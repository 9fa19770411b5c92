"""Load that moves between GPUs (MoE experts) is told from a slow GPU: departures that
come and go make the job a rotating one, where only a lasting departure counts."""

from __future__ import annotations

from typing import Any

from contracts.config import DetectConfig
from detectors.engine import ReplayRunner
from detectors.straggler import LONG_RUN_BINS
from simulator.cluster import Cluster, Fault, JobSpec, Simulator

T0 = 1_850_000_000.0


def _firing(cluster: Cluster, seconds: float, seed: int) -> list[dict[str, Any]]:
    runner = ReplayRunner(DetectConfig())
    return [d for s in Simulator(cluster, T0, seed=seed).samples(seconds)
            for d in runner.feed(s) if d["state"] == "firing"]


def test_a_hot_expert_that_moves_on_stops_raising_alarms() -> None:
    for seed in (3, 4):
        job = JobSpec("moe", [f"n{i}" for i in range(4)], kind="moe", moe_dwell_seconds=50)
        fired = _firing(Cluster([job]), 900, seed)
        # the first hot GPUs may fire before the job has shown that its load moves;
        # once it has, none does
        assert len(fired) <= 2, fired
        assert all(d["detected_at"] < T0 + 240 for d in fired), fired


def test_a_quiet_straggler_in_a_rotating_job_is_still_found() -> None:
    job = JobSpec("moe", [f"n{i}" for i in range(4)], kind="moe", moe_dwell_seconds=50)
    fault = Fault("slow_gpu_quiet", "moe", "n2", "6", T0 + 300, severity=1.25)
    fired = [d for d in _firing(Cluster([job], [fault]), 900, 3)
             if d["detected_at"] > fault.start]
    found = [d for d in fired if (d["node"], d["gpu"]) == ("n2", "6")]
    assert found, fired
    # it must outlast what a moving expert does before it counts
    assert found[0]["detected_at"] - fault.start <= LONG_RUN_BINS * 5 + 60
