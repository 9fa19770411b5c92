"""The held-out job physics classes (``vigil/evaluation/physics.py``) at 4 nodes on one
tuning seed: what fits in `make test` of `bench/bench_physics.py`. A training score:
the held-out seeds' figures are in bench/RESULTS.md."""

from __future__ import annotations

import statistics

from contracts.config import DetectConfig
from vigil.evaluation.benchdetect import run_suite
from vigil.evaluation.physics import CLASSES, TUNING_SEEDS, physics_suite

# Not met yet (issue #14 stays open): load that moves between MoE experts still raises
# an alarm in some jobs. A hot expert that first moves after the job has settled
# cannot be told from a slow GPU until it moves (detectors/straggler.py). At most one
# alarm per MoE job here; the held-out counts are in bench/RESULTS.md.
KNOWN_LIMIT = ("moe_rotating", "moe_rotating_net", "moe_hot_dwell", "moe_hot_dwell_net")


def test_physics_classes_at_four_nodes() -> None:
    delays: dict[str, list[float]] = {}
    for scenario in physics_suite(TUNING_SEEDS[:1], (4,)):
        vigil, _, _ = run_suite([scenario], DetectConfig())
        cls = scenario.name.rsplit("-", 2)[0]
        limit = 1 if cls in KNOWN_LIMIT else 0
        assert len(vigil.false_alarms) <= limit, vigil.false_alarms
        assert sum(vigil.found.values()) == sum(vigil.labels.values()), (cls, vigil.misses)
        delays[cls] = [d for v in vigil.delays.values() for d in v]
    large = [d for c in ("quiet_25", "slow_40", "slow_host") for d in delays[c]]
    assert statistics.median(large) <= 10 and max(large) <= 15, delays
    assert max(delays["quiet_12"]) <= 180, delays
    assert max(delays["quiet_5"]) <= 900, delays
    assert {c.name for c in CLASSES} == set(delays)
