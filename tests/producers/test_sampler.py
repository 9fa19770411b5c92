"""Properties of Moneo's adaptive sampler, with an injected clock (nothing sleeps)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.contracts.catalog import Scope
from vigil_gpu_monitor.producers.sampler import AdaptiveSampler, SamplingConfig

CFG = SamplingConfig(base_interval=1.0, max_interval=16.0)


def _run(values: list[float], name: str = "sm_active") -> list[tuple[int, float]]:
    sampler = AdaptiveSampler(CFG, random.Random(0))
    out = []
    for t, v in enumerate(values):
        got = sampler.offer(Scope.GPU, "0", name, v, float(t))
        if got is not None:
            out.append((t, got))
    return out


def test_stable_series_backs_off_to_the_cap() -> None:
    rng = random.Random(1)
    published = _run([0.6 + rng.gauss(0, 0.005) for _ in range(400)])
    assert len(published) < 400 / 10
    gaps = [b[0] - a[0] for a, b in zip(published, published[1:], strict=False)]
    assert max(gaps) <= CFG.max_interval + CFG.jitter + 1


@settings(max_examples=60, deadline=None)
@given(st.floats(0.2, 0.7), st.floats(0.12, 0.3), st.integers(30, 200), st.booleans())
def test_step_change_is_published_on_the_reading_that_carries_it(
        level: float, jump: float, at: int, down: bool) -> None:
    rng = random.Random(at)
    after = level - jump if down else min(1.0, level + jump)
    values = [level + rng.gauss(0, 0.003) for _ in range(at)] + [after] * 40
    published = dict(_run(values))
    assert at in published and abs(published[at] - after) < 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=200))
def test_published_values_stay_within_the_readings(values: list[float]) -> None:
    published = _run(values)
    assert published and published[0][0] == 0  # the first reading is always published
    for _, v in published:
        assert min(values) - 1e-9 <= v <= max(values) + 1e-9


def test_noisy_series_stays_at_the_base_interval() -> None:
    rng = random.Random(3)
    published = _run([rng.uniform(0.1, 0.9) for _ in range(200)])
    assert len(published) > 150


def test_health_signals_publish_on_change_and_back_off_while_quiet() -> None:
    values = [0.0] * 50 + [79.0] + [0.0] * 50
    published = _run(values, name="xid")
    assert (50, 79.0) in published and (51, 0.0) in published
    assert len(published) < 20


def test_unknown_metric_is_never_published() -> None:
    sampler = AdaptiveSampler(CFG)
    assert sampler.offer(Scope.GPU, "0", "cmdline_length", 1.0, 0.0) is None


def test_noise_estimate_recovers_the_sigma_of_gaussian_readings() -> None:
    estimates = []
    for seed in range(40):
        rng = random.Random(seed)
        sampler = AdaptiveSampler(CFG, random.Random(0))
        for t in range(64):
            sampler.offer(Scope.GPU, "0", "sm_active", 0.5 + rng.gauss(0, 0.02), float(t))
        estimates.append(sampler.noise_of(Scope.GPU, "0", "sm_active"))
    assert abs(sum(estimates) / len(estimates) - 0.02) < 0.002  # unbiased within 10 %


def test_noise_is_not_a_departure_but_a_step_beyond_it_still_is() -> None:
    """A series whose noise is as large as Moneo's 10 % band: with the noise test it
    publishes fewer values than without (noise_sigmas=0, every >10 % wobble fires), and
    a real drop is still published on the reading that carries it."""
    rng = random.Random(7)
    values = [0.3 + rng.gauss(0, 0.03) for _ in range(400)] + [0.05] * 20
    counts = {}
    for sigmas in (0.0, CFG.noise_sigmas):
        sampler = AdaptiveSampler(replace(CFG, noise_sigmas=sigmas), random.Random(0))
        published = [t for t, v in enumerate(values)
                     if sampler.offer(Scope.GPU, "0", "sm_active", v, float(t)) is not None]
        assert 400 in published
        counts[sigmas] = sum(1 for t in published if t < 400)
    assert counts[CFG.noise_sigmas] < 0.8 * counts[0.0]


@pytest.mark.parametrize("bad", [dict(peak_change=0.0), dict(density_min=1.5),
                                 dict(density_band=-0.1), dict(base_interval=0.0),
                                 dict(base_interval=32.0), dict(noise_sigmas=-1.0)])
def test_impossible_settings_are_refused_by_name(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingConfig(**bad)


def test_the_same_xid_code_twice_in_a_row_is_published_twice() -> None:
    sampler = AdaptiveSampler(SamplingConfig(jitter=0.0))
    offered = [0.0, 79.0, 79.0, 0.0]
    published = [sampler.offer(Scope.GPU, "0", "xid", v, float(t)) for t, v in enumerate(offered)]
    assert published == [0.0, 79.0, 79.0, 0.0]  # a state would have been published once
    gauge = [sampler.offer(Scope.GPU, "0", "pcie_width", v, float(t)) for t, v in
             enumerate([16.0, 8.0, 8.0])]
    assert gauge == [16.0, 8.0, 8.0] and sampler.offer(Scope.GPU, "0", "pcie_width", 8.0,
                                                        3.5) is None


def test_a_gpus_activity_counters_are_published_together_over_one_span() -> None:
    """Work per busy second is a ratio of two counters: both must cover one span."""
    from vigil_gpu_monitor.producers.sampler import TOGETHER, AdaptiveSampler, SamplingConfig

    sampler = AdaptiveSampler(SamplingConfig())
    spans = []
    for t in range(200):
        beat = 0.6 + 0.3 * ((t * 7) % 5 == 0)  # sm_active jumps now and then
        sample = {"schema": "vigil.sample/1", "ts": float(t), "job": "j", "node": "n",
                  "gpus": {"0": {"sm_active": beat, "tensor_active": 0.2, "sm_clock": 1980.0,
                                 "power": 500.0}}, "host": {}, "nics": {}}
        kept = sampler.thin(sample, float(t))["gpus"]["0"]
        published = {m for m in kept if m in TOGETHER}
        if published:
            spans.append(published)
    assert spans and all(p == {"sm_active", "tensor_active", "sm_clock"} for p in spans)
    assert len(spans) < 200  # still thinned
