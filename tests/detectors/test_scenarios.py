"""The scenario suite's targets on a subset that fits in `make test` (the whole suite
is `vigil bench detect`)."""

from __future__ import annotations

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.producers.sampler import SamplingConfig
from vigil_gpu_monitor.vigil.evaluation.benchdetect import run_suite
from vigil_gpu_monitor.vigil.evaluation.scenarios import suite


def test_scenario_subset_meets_the_targets() -> None:
    scenarios = suite(sizes=(4,), seeds=(3,))
    vigil, static, _ = run_suite(scenarios, DetectConfig())
    table = vigil.table()
    assert vigil.healthy_false_alarms == 0, vigil.false_alarms
    assert table["overall"]["f1"] is not None and table["overall"]["f1"] >= 0.95, vigil.misses
    for kind, row in table.items():
        if row["labels"]:
            assert row["recall"] is not None and row["recall"] >= 0.9, (kind, vigil.misses)
    assert table["overall"]["median_delay"] is not None
    assert table["overall"]["median_delay"] <= 30
    assert static.table()["overall"]["f1"] < table["overall"]["f1"]


def test_scenario_subset_meets_the_targets_on_what_adaptive_agents_publish() -> None:
    """Production agents sample adaptively (Moneo): stable metrics are published only
    every few seconds. The detectors must meet the same targets on that."""
    scenarios = suite(sizes=(4,), seeds=(3,))
    vigil, _, cost = run_suite(scenarios, DetectConfig(), SamplingConfig())
    table = vigil.table()
    # the thinning is real: 2.5x and more, where it was 4x before issue #28 (readings
    # now beat with the step, as real counters do, and a GPU's activity counters are
    # published together whenever one of them must be: a ratio of two needs one span)
    assert cost["values_read"] >= 2.5 * cost["values_published"]
    assert vigil.healthy_false_alarms == 0, vigil.false_alarms
    assert table["overall"]["f1"] is not None and table["overall"]["f1"] >= 0.95, vigil.misses
    for kind, row in table.items():
        if row["labels"]:
            assert row["recall"] is not None and row["recall"] >= 0.9, (kind, vigil.misses)
