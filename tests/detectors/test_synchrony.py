"""Barrier-based rules only for jobs whose GPUs move together (issue #45, DESIGN.md
principle 17): synchrony is measured from collective traffic, or declared."""

from __future__ import annotations

import random
from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

T0 = 1_900_000_000.0
BARRIER_KINDS = {"straggler", "hang", "slowdown", "load_imbalance"}


def _samples(fault: Fault | None = None, seconds: float = 300, seed: int = 4
             ) -> list[dict[str, Any]]:
    job = JobSpec("j", [f"n{i}" for i in range(4)])
    return list(Simulator(Cluster([job], [fault] if fault else []), T0, seed=seed)
                .samples(seconds))


def _as_replicas(samples: list[dict[str, Any]], seed: int = 1) -> list[dict[str, Any]]:
    """Independent replicas: each GPU's load its own (bursty, drawn per GPU and
    minute), no collective traffic, idle between requests."""
    rng = random.Random(seed)
    load: dict[tuple[str, str, int], float] = {}
    for s in samples:
        for name in s["nics"].values():
            name.update(ib_tx=0.0, ib_rx=0.0)
        for g, r in s["gpus"].items():
            share = load.setdefault((s["node"], g, int(s["ts"] // 60)), rng.uniform(0.2, 1.0))
            for m in ("sm_active", "tensor_active", "dram_active", "sm_occupancy"):
                r[m] = r[m] * share
            r.update(nvlink_tx=0.0, nvlink_rx=0.0, gpu_util=min(1.0, share * 1.05))
    return samples


def _fired(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    runner = ReplayRunner(DetectConfig())
    return [d for s in samples for d in runner.feed(s) if d["state"] == "firing"]


def test_independent_replicas_get_no_barrier_based_finding() -> None:
    fired = _fired(_as_replicas(_samples()))
    assert not [d for d in fired if d["kind"] in BARRIER_KINDS], fired


def test_replicas_still_get_health_checks() -> None:
    xid = Fault("xid", "j", "n1", "3", T0 + 100, severity=79.0)
    fired = _fired(_as_replicas(_samples(xid)))
    assert [(d["kind"], d["node"], d["gpu"]) for d in fired] == [("gpu_health", "n1", "3")]


def test_a_synchronous_job_is_measured_so_and_its_straggler_found() -> None:
    slow = Fault("slow_gpu_quiet", "j", "n2", "5", T0 + 100, severity=1.3)
    fired = _fired(_samples(slow))
    assert ("straggler", "n2", "5") in [(d["kind"], d["node"], d["gpu"]) for d in fired]


def test_a_declared_replica_job_is_not_compared_even_with_traffic() -> None:
    slow = Fault("slow_gpu_quiet", "j", "n2", "5", T0 + 100, severity=1.3)
    samples = _samples(slow)
    for s in samples:
        s["meta"] = {"job_sync": False}
    assert not [d for d in _fired(samples) if d["kind"] in BARRIER_KINDS]


def test_without_link_counters_a_job_is_presumed_synchronous() -> None:
    """Nothing to measure by (an agent without NVLink counters or InfiniBand ports):
    presumed synchronous, as training jobs are."""
    slow = Fault("slow_gpu_quiet", "j", "n2", "5", T0 + 100, severity=1.3)
    samples = _samples(slow)
    for s in samples:
        s["nics"] = {}
        for r in s["gpus"].values():
            r.pop("nvlink_tx", None)
            r.pop("nvlink_rx", None)
    fired = _fired(samples)
    assert ("straggler", "n2", "5") in [(d["kind"], d["node"], d["gpu"]) for d in fired]


def test_a_synchronous_job_that_hangs_stays_synchronous() -> None:
    """A hung job moves no bytes: once seen moving together, it stays so."""
    fired = _fired(_samples(Fault("hang", "j", None, None, T0 + 100), seconds=200))
    assert [d["kind"] for d in fired] == ["hang"]


def test_a_level_whose_witness_is_torn_is_not_compared_until_it_settles() -> None:
    """Serving replicas whose idle share hovers at the limit are judged apart in some
    bins and together in others (async_node seed 205 of the envelope: 11 of 24): they
    are not compared then, nor judged apart for good; a synchronous job whose level
    departs now and then is compared."""
    from vigil_gpu_monitor.detectors import synchrony
    from vigil_gpu_monitor.detectors.synchrony import MIN_JUDGED, SPREAD_BINS

    torn = {"idle_spread": [i % 2 == 0 for i in range(SPREAD_BINS)]}
    assert not synchrony._together(torn, "idle") and not torn.get("idle_apart")
    now_and_then = {"idle_spread": [i % 6 == 0 for i in range(SPREAD_BINS)]}  # 4 of 24
    assert synchrony._together(now_and_then, "idle")
    warming = {"idle_spread": [True] * (MIN_JUDGED - 1)}
    assert synchrony._together(warming, "idle")  # too few bins judged to say
    for _ in range(SPREAD_BINS):
        synchrony._spread(torn, "idle", 0.0)  # it settles: together again
    assert synchrony._together(torn, "idle")


def test_the_kept_bin_levels_equal_the_window_medians_at_every_step(monkeypatch: Any) -> None:
    """``BinLevels`` keeps each sealed bin's median from step to step: at every step
    of a run whose nodes drop samples and go silent, what it returns is, to the bit,
    the median of the window's matrix taken afresh."""
    from vigil_gpu_monitor.detectors import synchrony
    from vigil_gpu_monitor.detectors.robust import nanmedian

    checked = []
    real = synchrony.BinLevels.of

    def of(self: synchrony.BinLevels, view: Any, metric: str, busy: Any) -> Any:
        kept = real(self, view, metric, busy)
        fresh = nanmedian(busy, axis=0)
        assert kept.tobytes() == fresh.tobytes(), (view.bins, kept, fresh)
        checked.append(len(view.sealed))
        return kept

    monkeypatch.setattr(synchrony.BinLevels, "of", of)
    rng = random.Random(3)
    samples = [s for s in _samples(Fault("node_silent", "j", "n3", None, T0 + 120),
                                   seconds=240) if rng.random() > 0.1]
    _fired(samples)
    assert len(checked) > 20 and max(checked) >= 10  # steps over windows of sealed bins
