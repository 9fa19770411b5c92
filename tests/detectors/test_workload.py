"""More work is told from slowness (issue #28): a GPU carrying hot MoE experts is
busier *and* does more work, so it is a ``load_imbalance`` (info), never a
straggler, whether its load moves, wanders or stays; a slow GPU beside it is found
as fast as anywhere."""

from __future__ import annotations

from typing import Any

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

T0 = 1_850_000_000.0


def _firing(cluster: Cluster, seconds: float, seed: int) -> list[dict[str, Any]]:
    runner = ReplayRunner(DetectConfig())
    return [d for s in Simulator(cluster, T0, seed=seed).samples(seconds)
            for d in runner.feed(s) if d["state"] == "firing"]


def _moe(**kw: Any) -> JobSpec:
    return JobSpec("moe", [f"n{i}" for i in range(4)], kind="moe", **kw)


@pytest.mark.parametrize("load", [
    {"moe_dwell_seconds": 50},  # a hot expert that moves on
    {"moe_fixed_hot": 1, "moe_amplitude": 0.25},  # one that never moves
    {"moe_walk_sigma": 0.12, "moe_walk_steps": 300, "moe_replace_steps": 1000},
])
def test_moe_load_is_never_a_straggler(load: dict[str, Any]) -> None:
    for seed in (3, 4):
        fired = _firing(Cluster([_moe(**load)]), 600, seed)
        assert not [d for d in fired if d["kind"] == "straggler"], fired


def test_a_hot_expert_that_stays_is_reported_as_load_with_its_cost() -> None:
    sim_cluster = Cluster([_moe(moe_fixed_hot=1, moe_amplitude=0.25)])
    sim = Simulator(sim_cluster, T0, seed=5)
    runner = ReplayRunner(DetectConfig())
    fired = [d for s in sim.samples(400) for d in runner.feed(s) if d["state"] == "firing"]
    load = [d for d in fired if d["kind"] == "load_imbalance"]
    assert load and all(d["severity"] == "info" for d in load)
    truth = sorted(r for _, r in sim.load_truth["moe"])[len(sim.load_truth["moe"]) // 2] - 1
    estimate = load[0]["evidence"]["job_slowdown"]
    assert estimate == pytest.approx(truth, rel=0.25), (estimate, truth)


@pytest.mark.parametrize(("kind", "severity", "within"), [
    ("slow_gpu_quiet", 1.15, 180.0),  # a stall at the same clock: ≤ 3 min
    ("slow_gpu", 1.25, 10.0),  # throttled: ≤ 10 s (two bins)
])
def test_a_straggler_beside_moe_imbalance_is_found(kind: str, severity: float,
                                                   within: float) -> None:
    job = _moe(moe_walk_sigma=0.1, moe_walk_steps=500, moe_fixed_hot=1, moe_amplitude=0.2)
    fault = Fault(kind, "moe", "n2", "6", T0 + 300, severity=severity)
    fired = [d for d in _firing(Cluster([job], [fault]), 600, 3) if d["kind"] == "straggler"]
    found = [d for d in fired if (d["node"], d["gpu"]) == ("n2", "6")]
    assert found and fired == found[:len(fired)], fired
    assert found[0]["detected_at"] - fault.start <= within + 5  # bin edges: one more bin


@pytest.mark.parametrize(("stalled", "within"), [
    ("6", 20.0),  # another GPU: as fast as anywhere (10-15 s on seeds 7-9)
    ("0", 25.0),  # the memory-bound GPU itself: its stall shows above it (15-20 s)
])
def test_more_memory_bound_work_is_not_a_straggler_and_a_stall_is(stalled: str,
                                                                   within: float) -> None:
    """One GPU of each node does 25 % more work, all of it in memory-bound kernels
    (an uneven embedding or optimizer shard): busier than its peers with its tensor
    work level, so tensor work alone reads it as slow; its DRAM traffic says it does
    more. A 25 % stall keeps both tensor and DRAM work level while busy time rises,
    and must be found, on another GPU or on the memory-bound one itself."""
    job = JobSpec("emb", [f"n{i}" for i in range(4)], memory_work_gpus=1,
                  memory_work_extra=0.25)
    fault = Fault("slow_gpu_quiet", "emb", "n2", stalled, T0 + 180, severity=1.25)
    fired = [d for d in _firing(Cluster([job], [fault]), 300, 7) if d["kind"] == "straggler"]
    assert [(d["node"], d["gpu"]) for d in fired] == [("n2", stalled)], fired
    assert fired[0]["detected_at"] - fault.start <= within


def test_more_memory_bound_work_is_reported_as_load_in_bytes_moved() -> None:
    """The memory-bound GPU of each node (25 % more work, all memory-bound: its tensor
    work level, its bytes moved up) is workload: ``load_imbalance`` with its share in
    bytes moved, never a straggler (the real H100's copies read the same way:
    tests/detectors/test_real_counters.py)."""
    job = JobSpec("emb", [f"n{i}" for i in range(4)], memory_work_gpus=1,
                  memory_work_extra=0.25)
    fired = _firing(Cluster([job]), 600, 7)
    assert not [d for d in fired if d["kind"] == "straggler"], fired
    load = [d for d in fired if d["kind"] == "load_imbalance"]
    assert load and all(d["evidence"]["share_basis"] == "dram_active" for d in load), load
    assert all(d["evidence"]["share_above_peers"] > 0.1 for d in load)
    assert "memory-bound work" in load[0]["summary"]


def test_a_finding_in_a_bin_without_its_readings_holds_with_them_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose nodes but one miss every other bin (an agent polling less often
    than a bin; found on the foreign traces averaged over 5 s): the hot expert's load
    sums hold through the empty bins, and there its finding says its readings and
    cost are unknown (null), never NaN, which the detection contract refuses (it
    stopped `vigil replay` before). Every detection encodes."""
    import math

    import vigil_gpu_monitor.detectors.engine as engine
    from vigil_gpu_monitor.contracts.codec import encode_detection

    findings = []
    real = engine.find_stragglers
    monkeypatch.setattr(engine, "find_stragglers",
                        lambda *a: findings.extend(found := real(*a)) or found)
    runner = ReplayRunner(DetectConfig())
    sent = []
    for s in Simulator(Cluster([_moe(moe_fixed_hot=1, moe_amplitude=0.3)]), T0,
                       seed=5).samples(400):
        if s["node"] != "n0" and int((s["ts"] - T0) // 5) % 2 and s["ts"] > T0 + 40:
            continue  # every node but n0 misses every other bin
        sent.extend(runner.feed(s))
    for d in sent:
        encode_detection(d)
    load = [d for d in sent if d["kind"] == "load_imbalance" and d["state"] == "firing"]
    assert load and all(d["evidence"]["job_slowdown"] is not None  # fired on numbers
                        and not d["evidence"].get("unread") for d in load)
    numbers = [v for f in findings for v in f.evidence.values() if isinstance(v, float)]
    assert all(math.isfinite(v) for v in numbers)
    unread = [f for f in findings if f.evidence.get("unread")]
    assert unread and all(f.evidence["busy"] is None and f.evidence["job_slowdown"] is None
                          for f in unread)


def test_a_load_finding_in_a_bin_without_work_to_compare_holds_with_its_share_unknown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Bins where the job's GPUs are busy with no tensor work (a phase of other
    kernels): no work ratio to take, so the hot expert's load sums hold through them,
    and there its finding must say its share is unknown, not NaN (the fleet soak
    logged "non-finite evidence.share_above_peers" on a pipeline job before)."""
    import math

    import vigil_gpu_monitor.detectors.engine as engine

    findings = []
    real = engine.find_stragglers
    monkeypatch.setattr(engine, "find_stragglers",
                        lambda *a: findings.extend(found := real(*a)) or found)
    runner = ReplayRunner(DetectConfig())
    for s in Simulator(Cluster([_moe(moe_fixed_hot=1, moe_amplitude=0.3)]), T0,
                       seed=5).samples(400):
        if int((s["ts"] - T0) // 5) % 2 and s["ts"] > T0 + 60:
            for reading in s["gpus"].values():
                reading["tensor_active"] = 0.0
        runner.feed(s)
    load = [f for f in findings if f.kind == "load_imbalance"]
    assert [f for f in load if not f.evidence.get("unread")], load  # found on numbers
    numbers = [v for f in findings for v in f.evidence.values() if isinstance(v, float)]
    assert all(math.isfinite(v) for v in numbers)
    assert [f for f in load if f.evidence.get("unread")
            and f.evidence["share_above_peers"] is None]


@pytest.mark.parametrize("start", [0.0, 200.0])
def test_a_hot_expert_clocked_down_by_the_power_cap_is_load_not_a_straggler(start: float) -> None:
    """Under the board's power limit the driver trades clock for power: the GPU doing
    more work draws more and runs a lower clock, with only the SW power cap reason
    (0x4) up. Its clock deficit is load, never a straggler (issue #45)."""
    job = _moe(moe_fixed_hot=1, moe_amplitude=0.3)
    probe = Simulator(Cluster([job]), T0, seed=6)
    list(probe.samples(2))
    hot = int(probe._drawn[("moe", "fixed-hot")])
    node, gpu = f"n{hot // 8}", str(hot % 8)
    capped = Fault("slow_gpu", "moe", node, gpu, T0 + start, severity=1.04)  # 0x4, clock -4 %
    fired = _firing(Cluster([job], [capped]), 500, 6)
    assert not [d for d in fired if d["kind"] == "straggler"], fired
    assert [d for d in fired if d["kind"] == "load_imbalance" and d["node"] == node]
