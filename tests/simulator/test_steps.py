"""Per-rank step timings from the simulator's physics (``simulator/steps.py``)."""

from __future__ import annotations

import statistics

from vigil_gpu_monitor.contracts.steps import validate_step_batch
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.simulator.steps import StepTimings

T0 = 1_700_000_000.0
NODES = ["a", "b", "c"]


def _run(cluster: Cluster, seconds: float, sigma: float = 0.05, attach: bool = True
         ) -> tuple[list, list, Simulator]:  # type: ignore[type-arg]
    sim = Simulator(cluster, T0, seed=5)
    timings = StepTimings(seed=5, seq_sigma=sigma)
    if attach:
        sim.step_timings = timings
    samples, batches = [], []
    for sample in sim.samples(seconds):
        samples.append(sample)
        batches.extend(timings.drain())
    return samples, batches, sim


def _steps(batches: list) -> dict[int, dict[str, dict]]:  # type: ignore[type-arg]
    """step index → "node/gpu" → its record."""
    out: dict[int, dict[str, dict]] = {}  # type: ignore[type-arg]
    for batch in batches:
        for rank in batch["ranks"]:
            for step in rank["steps"]:
                out.setdefault(step["step"], {})[f"{batch['node']}/{rank['gpu']}"] = step
    return out


def test_timings_follow_the_steps_and_the_contract() -> None:
    _, batches, sim = _run(Cluster([JobSpec("j", NODES)]), 30)
    for batch in batches:
        validate_step_batch(batch)
    steps = _steps(batches)
    assert sorted(steps) == list(range(len(steps))) and len(steps) > 20
    for ranks in steps.values():
        assert len(ranks) == 24
        walls = {r["wall"] for r in ranks.values()}
        assert len(walls) == 1  # synchronous: every rank's step is the same
        wall = walls.pop()
        assert all(r["compute"] <= wall for r in ranks.values())
        assert wall - max(r["compute"] for r in ranks.values()) > 0.15  # the collective
    # ends are a clock: each step ends one wall after the one before
    ends = [next(iter(steps[i].values()))["end"] for i in sorted(steps)]
    assert all(b > a for a, b in zip(ends, ends[1:], strict=False))
    assert len(sim.step_timings.walls["j"]) == len(steps)  # type: ignore[union-attr]


def test_attaching_timings_leaves_every_sample_as_it_was() -> None:
    cluster = Cluster([JobSpec("j", NODES)], [Fault("slow_gpu", "j", "b", "2", T0 + 10)])
    with_timings, _, _ = _run(cluster, 20)
    without, _, _ = _run(cluster, 20, attach=False)
    assert with_timings == without


def test_sequence_length_noise_moves_every_rank_together() -> None:
    _, batches, _ = _run(Cluster([JobSpec("j", NODES)]), 60, sigma=0.2)
    steps = _steps(batches)
    walls = [next(iter(r.values()))["wall"] for r in steps.values()]
    assert statistics.pstdev(walls) / statistics.fmean(walls) > 0.1  # steps vary a lot ...
    for ranks in steps.values():  # ... but within a step the ranks stay alike
        computes = [r["compute"] for r in ranks.values()]
        assert max(computes) / min(computes) < 1.1


def test_a_cpu_stall_delays_its_rank_while_its_gpu_idles() -> None:
    stall = Fault("slow_host", "j", "b", "5", T0, severity=1.3)
    samples, batches, _ = _run(Cluster([JobSpec("j", NODES)], [stall]), 30)
    steps = _steps(batches)
    for ranks in list(steps.values())[2:]:
        others = statistics.median(r["compute"] for k, r in ranks.items() if k != "b/5")
        assert ranks["b/5"]["compute"] > 1.25 * others
    util = statistics.fmean(s["gpus"]["5"]["gpu_util"] for s in samples if s["node"] == "b")
    peer = statistics.fmean(s["gpus"]["4"]["gpu_util"] for s in samples if s["node"] == "b")
    assert util < peer - 0.1  # no kernel while its host is late: idle, not busy


def test_pipeline_ranks_carry_their_stage() -> None:
    job = JobSpec("p", [f"n{i}" for i in range(4)], kind="pipeline", stages=2)
    _, batches, _ = _run(Cluster([job]), 10)
    stage = {b["node"]: {r["stage"] for r in b["ranks"]} for b in batches}
    assert stage == {"n0": {0}, "n1": {1}, "n2": {0}, "n3": {1}}
    last = _steps(batches)[3]
    assert statistics.median(last[f"n1/{g}"]["compute"] for g in range(8)) > 1.15 * (
        statistics.median(last[f"n2/{g}"]["compute"] for g in range(8)))


def test_a_hung_job_ends_no_step() -> None:
    hang = Fault("hang", "j", None, None, T0 + 10)
    _, batches, _ = _run(Cluster([JobSpec("j", NODES)], [hang]), 30)
    assert max(s["end"] for b in batches for r in b["ranks"] for s in r["steps"]) < T0 + 11
