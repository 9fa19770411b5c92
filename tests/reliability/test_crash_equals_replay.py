"""Crash equals replay (issue #28): a worker SIGKILLed in the middle of a trace and
restarted publishes exactly the detections that replay of that trace gives, no more
and no fewer: stragglers, load imbalance and a job's slowdown included. With step
timings (issue #47: every job's per-rank timings on ``vigil.steps`` beside its
samples), the same, the two topics read again from their commits after the kill.

The restarted worker may publish a detection twice (one sent after its last
checkpoint is sent again: at-least-once); the same id, state and time twice is one
detection. Anything else (a firing replay does not give, one it misses, another
time) fails."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.kafka_helpers import (
    log_excerpt,
    publish,
    publish_trace,
    read_topic,
    start_worker,
)
from tests.streams.step_trace import replayed
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.simulator.steps import StepTimings

pytestmark = pytest.mark.integration
START = 1_893_000_000.0
SECONDS = 420
JOBS = [JobSpec("crash-dp", [f"dp{i}" for i in range(4)]),
        JobSpec("crash-moe", [f"moe{i}" for i in range(4)], kind="moe", moe_fixed_hot=1,
                moe_amplitude=0.3, moe_walk_sigma=0.08),
        # two nodes: too few to compare a node with its peers, so the loader is the
        # job's slowdown (with more, it is a host-bound straggler node)
        JobSpec("crash-dl", ["dl0", "dl1"])]
FAULTS = [Fault("slow_gpu_quiet", "crash-dp", "dp1", "3", START + 120, severity=1.2),
          Fault("slow_gpu", "crash-moe", "moe2", "5", START + 200, severity=1.3),
          Fault("slow_host", "crash-dl", "dl1", None, START + 180, severity=1.25)]

Key = tuple[str, str, str, float]


def _keys(detections: list[dict[str, Any]]) -> set[Key]:
    return {(d["id"], d["kind"], d["state"], d["detected_at"]) for d in detections}


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _trace(timings: bool) -> list[dict[str, Any]]:
    """The samples, and with ``timings`` each job's step batches after the sample that
    drained them (the simulator's order, as agents send them)."""
    cluster = Cluster(JOBS, FAULTS, skew_seconds=3.0, loss=0.01, reorder_seconds=2.0)
    sim = Simulator(cluster, START, seed=6)
    if not timings:
        return [dict(s) for s in sim.samples(SECONDS)]
    sim.step_timings = steps = StepTimings(seed=6)
    out: list[dict[str, Any]] = []
    for sample in sim.samples(SECONDS):
        out.append(dict(sample))
        out.extend(dict(batch) for batch in steps.drain())
    return out


def _publish(cfg: Config, messages: list[dict[str, Any]], timings: bool) -> None:
    if timings:
        publish_trace(cfg, messages)
    else:
        publish(cfg, messages)


@pytest.mark.parametrize("timings", [False, True], ids=["samples", "samples+steps"])
def test_a_worker_killed_mid_trace_publishes_what_replay_gives(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path,
        timings: bool) -> None:
    samples = _trace(timings)
    if timings:
        expected = _keys(replayed(samples, isolated_cfg.detect))
    else:
        runner = ReplayRunner(isolated_cfg.detect)
        expected = _keys([d for s in samples for d in runner.feed(s)])  # type: ignore[arg-type]
    kinds = {k[1] for k in expected}
    assert {"straggler", "load_imbalance", "slowdown"} <= kinds, expected  # worth testing
    cut = next(i for i, s in enumerate(samples) if s.get("ts", 0) >= START + 230)
    _publish(isolated_cfg, samples[:cut], timings)
    env = dict(isolated_env, VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="8")
    first = start_worker(env, str(tmp_path / "worker-1.log"))
    try:  # killed once it has published some of what the first part holds
        seen = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 3, 150, first)
        assert seen, log_excerpt(tmp_path / "worker-1.log")
    finally:
        _kill(first)
    _publish(isolated_cfg, samples[cut:], timings)
    second = start_worker(env, str(tmp_path / "worker-2.log"))
    try:
        values = read_topic(isolated_cfg, topics.DETECTIONS,
                            lambda v: _keys([decode_detection(x) for x in v]) >= expected,
                            240, second)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)
    published = _keys([decode_detection(v) for v in values])
    log = log_excerpt(tmp_path / "worker-2.log", 2000)
    assert published - expected == set(), f"not in replay: {published - expected}\n{log}"
    assert expected - published == set(), f"missing: {expected - published}\n{log}"
