"""The physics envelope does what its documents say (issue #45): the SMs a waiting GPU
holds, NVML's last-period utilisation, the clock the driver holds at the power limit,
a node-wide power brake, replicas with no barrier, and the agent's own quirks."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from typing import Any

import pytest

from vigil_gpu_monitor.contracts.codec import validate_sample
from vigil_gpu_monitor.simulator.cluster import JOB_KINDS, Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.simulator.envelope import RANGES, Envelope, EnvelopeError, draw

T0 = 1_840_000_000.0
ENV = Envelope(nccl_channels=24, util_period=1 / 6, power_limit=700.0, compute_watts=950.0,
               silicon_sigma=0.01, temp_sigma=2.0, tick=1.0, tick_jitter=0.0, clock_skew=0.0,
               loss=0.0, stale_rate=0.0, nics=8, host_gap=0.03)


def _run(job: JobSpec, faults: list[Fault] | None = None, seconds: float = 60.0,
         tick: float | None = None, seed: int = 3) -> tuple[list[dict[str, Any]], Simulator]:
    sim = Simulator(Cluster([job], faults or [], tick=tick), T0, seed=seed)
    return list(sim.samples(seconds)), sim


def _gpu(samples: list[dict[str, Any]], node: str, gpu: str, since: float = 0.0
         ) -> list[dict[str, float]]:
    return [s["gpus"][gpu] for s in samples if s["node"] == node and s["ts"] - T0 >= since]


def test_draws_stay_in_range_and_pins_hold_one_end() -> None:
    rng = random.Random(1)
    for _ in range(200):
        env = draw(rng)
        assert 2 <= env.nccl_channels <= 32 and env.nics in (4, 8)
        assert RANGES["util_period"][0] <= env.util_period <= RANGES["util_period"][1]
        assert 1.0 <= env.tick <= 30.0 and 500.0 <= env.power_limit <= 700.0
    assert draw(rng, {"nccl_channels": "low"}).nccl_channels == 2
    assert draw(rng, {"nccl_channels": "high"}).nccl_channels == 32
    assert draw(rng, {"tick": "high"}).tick == 30.0
    # pinning one leaves the others' draws as they were
    a, b = draw(random.Random(5)), draw(random.Random(5), {"power_limit": "low"})
    assert a.util_period == b.util_period and b.power_limit == 500.0
    with pytest.raises(EnvelopeError, match="no envelope parameter"):
        draw(rng, {"channels": "low"})
    with pytest.raises(EnvelopeError, match="'low' or 'high'"):
        draw(rng, {"tick": "middle"})


@pytest.mark.parametrize("channels", [2, 32])
def test_a_hung_gpu_holds_one_sm_per_channel_and_moves_nothing(channels: int) -> None:
    job = JobSpec("j", ["a", "b"], envelope=replace(ENV, nccl_channels=channels))
    samples, sim = _run(job, [Fault("hang", "j", None, None, T0 + 20)], 50)
    for s in samples:
        validate_sample(s)
    hung = [r for g in "07" for r in _gpu(samples, "b", g, since=25)]
    assert statistics.fmean(r["sm_active"] for r in hung) == pytest.approx(
        channels / 132, abs=0.01)
    assert {r["gpu_util"] for r in hung} == {1.0}
    assert max(r["tensor_active"] for r in hung) < 0.02
    assert max(r["nvlink_tx"] for r in hung) == 0.0
    assert max(r["pcie_tx"] for r in hung) < 1e7
    assert max(n["ib_tx"] for s in samples if s["ts"] - T0 >= 25 for n in s["nics"].values()) == 0
    # the ground truth: no progress at all
    assert math.isinf(sim.truth["j"][-1][1])


def test_gpu_util_is_the_last_periods_integer_percent_read_at_one_instant() -> None:
    job = JobSpec("j", ["a", "b"], envelope=replace(ENV, host_gap=0.08))
    samples, _ = _run(job, seconds=80)
    utils = [s["gpus"][g]["gpu_util"] for s in samples for g in s["gpus"]]
    assert all(abs(u * 100 - round(u * 100)) < 1e-9 for u in utils)  # integer percent
    for s in samples:  # the 8 GPUs of a node read the same instant of the same step
        assert len({r["gpu_util"] for r in s["gpus"].values()}) == 1
    # a sixth of a second landing on the host's gap reads far below the tick's mean
    # (92 %), another reads 100 %
    assert max(utils) == 1.0 and min(utils) < 0.75
    period_long = JobSpec("k", ["a", "b"], envelope=replace(ENV, host_gap=0.08, util_period=1.0))
    long_utils = [s["gpus"]["0"]["gpu_util"] for s in _run(period_long, seconds=80)[0]]
    assert min(long_utils) >= 0.9  # a one-second period is the step's mean


def test_a_hot_expert_under_the_power_cap_runs_a_lower_clock_with_0x4() -> None:
    job = JobSpec("m", ["a", "b"], kind="moe", moe_fixed_hot=1, moe_amplitude=0.3,
                  moe_walk_sigma=0.01, compute_seconds=0.4, comm_seconds=0.1, envelope=ENV)
    samples, _ = _run(job, seconds=60)
    power = {(n, g): statistics.fmean(r["power"] for r in _gpu(samples, n, g, 5))
             for n in "ab" for g in "01234567"}
    hot = max(power, key=lambda k: power[k])
    clock = {k: statistics.fmean(r["sm_clock"] for r in _gpu(samples, *k, 5)) for k in power}
    peers = statistics.median(v for k, v in clock.items() if k != hot)
    assert clock[hot] < peers - 40  # more work, more power, a lower clock
    assert all(int(r["throttle"]) & 0x4 for r in _gpu(samples, *hot, 5))
    assert not any(int(r["throttle"]) & 0xE8 for s in samples for r in s["gpus"].values())


def test_a_gpu_at_a_lower_limit_is_capped_below_nominal_and_faults_keep_their_bits() -> None:
    job = JobSpec("j", ["a", "b"], envelope=replace(ENV, power_limit=500.0))
    samples, _ = _run(job, [Fault("slow_gpu", "j", "a", "2", T0 + 20, severity=1.3),
                            Fault("thermal", "j", "b", "5", T0 + 20)], 40)
    healthy = _gpu(samples, "b", "0", 25)
    assert statistics.fmean(r["sm_clock"] for r in healthy) < 1900
    assert all(int(r["throttle"]) == 0x4 for r in healthy)
    assert all(int(r["throttle"]) & 0x8 for r in _gpu(samples, "a", "2", 25))
    assert all(int(r["throttle"]) & 0x40 for r in _gpu(samples, "b", "5", 25))


def test_a_capped_clock_wanders_at_constant_power_in_15_mhz_steps() -> None:
    """As the H200 did at its limit (bench/real_gpu_envelope.py): read once a second,
    the capped clock moves by the envelope's σ with a lag-1 autocorrelation near
    exp(-1 s / 5 s); read every 30 s, the readings are nearly independent. Its draw
    does not rise with it (a clock that set the draw would move it as its square),
    and every reading is a multiple of 15 MHz."""
    for jitter, tick, seconds in ((0.025, 1.0, 600.0), (0.0, 1.0, 600.0), (0.025, 30.0, 3000.0)):
        job = JobSpec("w", ["a", "b"], envelope=replace(ENV, clock_jitter=jitter))
        samples, _ = _run(job, seconds=seconds, tick=tick)
        readings = _gpu(samples, "a", "3", 30)
        clocks = [r["sm_clock"] for r in readings]
        assert all(int(r["throttle"]) == 0x4 for r in readings)
        assert all(r["sm_clock"] % 15 == 0 for s in samples for r in s["gpus"].values())
        if jitter:
            spread = statistics.pstdev(clocks) / statistics.fmean(clocks)
            assert spread == pytest.approx(jitter, rel=0.35)
            lag1 = statistics.correlation(clocks[:-1], clocks[1:])
            assert (lag1 == pytest.approx(math.exp(-1 / 5), abs=0.1) if tick == 1.0
                    else abs(lag1) < 0.35)
            assert statistics.correlation(clocks, [r["power"] for r in readings]) < 0.1
        else:
            assert statistics.pstdev(clocks) / statistics.fmean(clocks) < 0.005


def test_a_power_brake_clocks_down_every_gpu_of_its_node_with_0x80() -> None:
    job = JobSpec("b", ["a", "b", "c"], envelope=ENV)
    fault = Fault("power_brake", "b", "b", None, T0 + 10, severity=1.5)
    samples, sim = _run(job, [fault], 30)
    braked = [s for s in samples if s["node"] == "b" and s["ts"] - T0 > 12]
    assert braked and all(len(s["gpus"]) == 8 for s in braked)
    assert all(int(r["throttle"]) & 0x80 and r["sm_clock"] < 1400
               for s in braked for r in s["gpus"].values())
    assert not any(int(r["throttle"]) & 0x80 for s in samples if s["node"] != "b"
                   for r in s["gpus"].values())
    assert len(Cluster([job], [fault]).labels()) == 1
    assert sim.truth["b"][-1][1] > 1.3


def test_async_replicas_gpus_do_not_move_together_and_never_wait() -> None:
    job = JobSpec("r", ["a", "b"], kind="async_replicas", envelope=ENV)
    samples, sim = _run(job, seconds=240)
    series = {g: [s["gpus"][g]["gpu_util"] for s in samples if s["node"] == "a"]
              for g in "01234567"}
    pairs = [statistics.correlation(series[a], series[b])
             for a in series for b in series if a < b]
    assert statistics.fmean(pairs) < 0.4
    means = [statistics.fmean(v) for v in series.values()]
    assert max(means) - min(means) > 0.1  # each replica's load is its own
    ib = [n["ib_tx"] for s in samples for n in s["nics"].values()]
    assert max(ib) < 0.05 * 50e9
    assert {r for _, r in sim.truth["r"]} == {1.0}
    whole_node = replace(job, name="w", replica_gpus=8)
    grouped, _ = _run(whole_node, seconds=60)
    for s in grouped:  # one replica on a node's 8 GPUs: they move together
        assert max(r["gpu_util"] for r in s["gpus"].values()) - min(
            r["gpu_util"] for r in s["gpus"].values()) < 0.05


def test_the_agents_tick_jitter_nics_and_stale_fields() -> None:
    env = replace(ENV, tick=10.0, tick_jitter=0.05, nics=4, stale_rate=1.0)
    job = JobSpec("j", ["a", "b"], envelope=env)
    samples, _ = _run(job, seconds=200, tick=env.tick)
    stamps = [s["ts"] for s in samples if s["node"] == "a"]
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    assert len(stamps) == 20 and 8.0 < min(gaps) and max(gaps) < 12.0
    assert len(set(gaps)) > 1  # jitter
    assert all(len(s["nics"]) == 4 for s in samples)
    first = _gpu(samples, "a", "0")
    assert len({r["sm_active"] for r in first}) == 1  # always stale: the first value kept
    assert len({r["power"] for r in first}) > 1  # NVML's fields are fresh


@pytest.mark.parametrize("kind", JOB_KINDS)
def test_every_job_kind_makes_valid_samples_with_the_envelope(kind: str) -> None:
    job = JobSpec(f"k-{kind}", ["a", "b", "c", "d"], kind=kind, stages=4, microbatches=4,
                  stage_work=(1.1, 1.0, 1.0, 1.2), tp_size=4, envelope=ENV)
    samples, sim = _run(job, seconds=30)
    assert len(samples) == 4 * 30
    for s in samples:
        validate_sample(s)
    ratio = statistics.fmean(r for _, r in sim.truth[job.name])
    assert ratio == pytest.approx(1.0, abs=0.05)  # healthy: no fault cost
    if kind == "tensor_parallel":  # per-layer all-reduces while computing
        assert statistics.fmean(r["nvlink_tx"] for r in _gpu(samples, "a", "0")) > 0.2 * 300e9


def test_a_1f1b_pipeline_waits_in_its_bubbles() -> None:
    plain = JobSpec("p", ["a", "b", "c", "d"], kind="pipeline", envelope=ENV)
    f1b = replace(plain, name="q", kind="pipeline_1f1b", microbatches=4,
                  stage_work=(1.0, 1.0, 1.0, 1.0))
    busy = {}
    for job in (plain, f1b):
        samples, _ = _run(job, seconds=40)
        busy[job.kind] = statistics.fmean(r["tensor_active"] for s in samples
                                          for r in s["gpus"].values())
    assert busy["pipeline_1f1b"] < 0.75 * busy["pipeline"]  # (4 + 3) / 4 of the compute


def test_a_thermal_creep_sets_sw_thermal_then_hw_thermal() -> None:
    job = JobSpec("j", ["a", "b"], envelope=ENV)
    samples, _ = _run(job, [Fault("thermal_creep", "j", "a", "1", T0, severity=1.3)], 660,
                      tick=10.0)
    bits = [(s["ts"] - T0, int(s["gpus"]["1"]["throttle"])) for s in samples
            if s["node"] == "a"]
    assert all(b & 0x60 == 0 for t, b in bits if t < 280)
    assert all(b & 0x20 and not b & 0x40 for t, b in bits if 320 < t < 590)
    assert all(b & 0x60 == 0x60 for t, b in bits if t > 610)
