"""The held-out job physics classes (``vigil/evaluation/physics.py``) at 4 nodes on one
tuning seed: what fits in `make test` of `bench/bench_physics.py`. A training score:
the held-out seeds' figures are in bench/RESULTS.md."""

from __future__ import annotations

import statistics

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.vigil.evaluation.benchdetect import run_suite
from vigil_gpu_monitor.vigil.evaluation.physics import CLASSES, TUNING_SEEDS, physics_suite

# A network-heavy MoE may well be network-bound; no class may raise anything else.
ALLOWED = {"moe_rotating_net": "network_bound", "moe_hot_dwell_net": "network_bound",
           "moe_persistent_net": "network_bound"}


def test_physics_classes_at_four_nodes() -> None:
    delays: dict[str, list[float]] = {}
    for scenario in physics_suite(TUNING_SEEDS[:1], (4,)):
        vigil, _, _ = run_suite([scenario], DetectConfig())
        cls = scenario.name.rsplit("-", 2)[0]
        wrong = [a for a in vigil.false_alarms if f": {ALLOWED.get(cls, '-')} " not in a]
        assert not wrong, wrong
        assert sum(vigil.found.values()) == sum(vigil.labels.values()), (cls, vigil.misses)
        delays[cls] = [d for v in vigil.delays.values() for d in v]
    large = [d for c in ("quiet_25", "slow_40", "moe_throttled") for d in delays[c]]
    assert statistics.median(large) <= 10 and max(large) <= 15, delays
    assert max(delays["quiet_25_long_steps"]) <= 60, delays  # 10 s steps, 5 s bins
    assert max(delays["degraded_at_start"]) <= 20, delays  # from the job's first bin
    assert max(delays["quiet_12"]) <= 180 and max(delays["moe_stall_15"]) <= 180, delays
    # a host-bound straggler node: its idle time and its power deficit must both pass
    assert max(delays["slow_host"]) <= 30, delays
    assert max(delays["quiet_5"]) <= 900, delays
    assert {c.name for c in CLASSES} == set(delays)
