"""Crash equals replay without Kafka (issue #28): an engine restored from its
checkpoint (``encode_state`` / ``decode_state``, as the worker writes and reads it)
at any sample decides exactly what the engine that never stopped decides.

The Kafka test (``tests/reliability/test_crash_equals_replay.py``) kills a worker at
one moment, which lands on a different sample each run; this one restores at
several cuts of the same trace. Found with it (and by that test failing twice in
five runs): the clock offsets' reference (the median offset, taken at each vote of
the job's clock) and the samples since the last vote were not checkpointed; a
restored engine took the reference from the offsets of the moment, shifted its
nodes' samples by other amounts until the next vote, and at some cuts fired a
``load_imbalance`` 15 s early or on another GPU."""

from __future__ import annotations

from typing import Any

import pytest

from tests.reliability.test_crash_equals_replay import FAULTS, JOBS, SECONDS, START
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import JobEngine, ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Simulator
from vigil_gpu_monitor.streams.state_codec import decode_state, encode_state

Key = tuple[str, str, str, float]


@pytest.fixture(scope="module")
def trace() -> tuple[list[dict[str, Any]], set[Key]]:
    cluster = Cluster(JOBS, FAULTS, skew_seconds=3.0, loss=0.01, reorder_seconds=2.0)
    samples = list(Simulator(cluster, START, seed=6).samples(SECONDS))
    runner = ReplayRunner(DetectConfig())
    return samples, _keys([d for s in samples for d in runner.feed(s)])


def _keys(detections: list[dict[str, Any]]) -> set[Key]:
    return {(d["id"], d["kind"], d["state"], d["detected_at"]) for d in detections}


@pytest.mark.parametrize("cut", [900, 1640, 1750, 2261, 3000])
def test_an_engine_restored_from_its_checkpoint_decides_what_replay_does(
        trace: tuple[list[dict[str, Any]], set[Key]], cut: int) -> None:
    samples, expected = trace
    assert {k[1] for k in expected} >= {"straggler", "load_imbalance", "slowdown"}
    cfg = DetectConfig()
    runner = ReplayRunner(cfg)
    found = [d for s in samples[:cut] for d in runner.feed(s)]
    for job, engine in list(runner.engines.items()):
        runner.engines[job] = JobEngine(job, cfg, decode_state(encode_state(engine.to_state())))
    found += [d for s in samples[cut:] for d in runner.feed(s)]
    assert _keys(found) == expected
