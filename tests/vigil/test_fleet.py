"""The fleet soak's jobs are healthy and varied, and its bound is the Poisson one."""

from __future__ import annotations

import math

import pytest

from vigil_gpu_monitor.vigil.evaluation.fleet import KINDS, fleet_job, kind_of, poisson_upper


def test_poisson_upper_bound_matches_the_known_values() -> None:
    assert poisson_upper(0) == pytest.approx(-math.log(0.05), rel=1e-6)  # 3.0
    assert poisson_upper(1) == pytest.approx(4.744, abs=1e-3)
    assert poisson_upper(10) == pytest.approx(17.0, abs=0.1)


def test_fleet_jobs_are_healthy_varied_and_the_same_every_time() -> None:
    jobs = [fleet_job(i, 0.0, 3600.0, seed=1) for i in range(40)]
    assert all(not j.cluster.faults for j in jobs)
    assert {j.name.split("-")[3] for j in jobs} == set(KINDS)
    assert len({len(j.cluster.jobs[0].nodes) for j in jobs}) >= 4
    assert any(j.cluster.node_loss for j in jobs) and any(j.cluster.drift for j in jobs)
    assert any(e.kind == "checkpoint" for j in jobs for e in j.cluster.jobs[0].events)
    again = fleet_job(7, 0.0, 3600.0, seed=1)
    assert again.name == jobs[7].name and again.gpu_hours == jobs[7].gpu_hours


def test_the_envelope_fleet_draws_physics_and_holds_its_shares_of_kinds() -> None:
    jobs, hours = [], 0.0
    while hours < 20_000:  # GPU-hours at two hours a job, as the soak plans them
        jobs.append(fleet_job(len(jobs), 0.0, 7200.0, seed=1, envelope=True))
        hours += jobs[-1].gpu_hours
    assert all(not j.cluster.faults for j in jobs)
    specs = [j.cluster.jobs[0] for j in jobs]
    assert all(s.envelope is not None for s in specs)
    assert len({s.envelope.nccl_channels for s in specs if s.envelope}) > 8
    assert len({j.cluster.tick for j in jobs}) >= 4
    kinds = {s.kind for s in specs}
    assert {"async_replicas", "tensor_parallel", "pipeline_1f1b", "fsdp", "moe"} <= kinds

    def share(prefix: str) -> float:
        return sum(j.gpu_hours for j in jobs if kind_of(j).startswith(prefix)) / hours

    assert share("moe") >= 0.30 and share("async") >= 0.10
    again = fleet_job(5, 0.0, 7200.0, seed=1, envelope=True)
    assert again.cluster.jobs[0] == specs[5]
