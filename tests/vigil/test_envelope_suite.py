"""The held-out envelope suite: seeds kept apart, every class built, pins held, the same
scenario every time."""

from __future__ import annotations

from vigil_gpu_monitor.simulator.cluster import FAULT_KINDS, JOB_KINDS, Simulator
from vigil_gpu_monitor.simulator.envelope import RANGES
from vigil_gpu_monitor.vigil.evaluation.envelope import (
    CLASSES,
    HELD_OUT_SEEDS,
    TUNING_SEEDS,
    envelope_suite,
)


def test_seeds_are_apart_and_every_class_and_kind_is_built() -> None:
    assert not set(TUNING_SEEDS) & set(HELD_OUT_SEEDS)
    suite = envelope_suite(HELD_OUT_SEEDS, (4,))
    assert len(suite) == len(CLASSES) * len(HELD_OUT_SEEDS)
    kinds = {sc.cluster.jobs[0].kind for sc in suite}
    assert kinds == set(JOB_KINDS) - {"pipeline"}
    assert all(lab["kind"] in FAULT_KINDS for sc in suite for lab in sc.cluster.labels())
    assert sum(sc.healthy for sc in suite) == len(HELD_OUT_SEEDS) * sum(
        not c.effect for c in CLASSES)
    # the envelope is drawn: jobs differ in what the documents leave open
    envs = [sc.cluster.jobs[0].envelope for sc in suite]
    assert all(e is not None for e in envs)
    assert len({e.nccl_channels for e in envs if e}) > 5
    assert len({sc.cluster.tick for sc in suite}) > 2


def test_pins_hold_a_parameter_at_one_end_and_scenarios_repeat() -> None:
    low = envelope_suite((201,), (4,), pins={"nccl_channels": "low", "tick": "high"})
    assert {sc.cluster.jobs[0].envelope.nccl_channels for sc in low  # type: ignore[union-attr]
            } == {int(RANGES["nccl_channels"][0])}
    assert {sc.cluster.tick for sc in low} == {30.0}
    assert all(sc.duration >= 150 + 12 * 30 for sc in low)
    again = envelope_suite((201,), (4,), pins={"nccl_channels": "low", "tick": "high"})
    assert [sc.cluster.jobs[0] for sc in low] == [sc.cluster.jobs[0] for sc in again]
    first = low[0]
    one = list(Simulator(first.cluster, first.start, seed=first.seed).samples(90))
    two = list(Simulator(again[0].cluster, again[0].start, seed=again[0].seed).samples(90))
    assert one == two and one
