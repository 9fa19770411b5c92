"""Failures mid-run, counted against the simulator's ground truth: a worker
SIGKILLed twice in a row, and a Kafka broker restart while agents publish and a
worker consumes. No incident is lost and none fires twice."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.kafka_helpers import log_excerpt, publish, read_topic, start_worker
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.producers.publisher import BufferedPublisher
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops import localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
START = 1_890_000_000.0
JOBS = [JobSpec("job-a", [f"a{i}" for i in range(4)]),
        JobSpec("job-b", [f"b{i}" for i in range(4)])]
FAULTS = [Fault("slow_gpu", "job-a", "a2", "6", START + 40),
          Fault("node_silent", "job-b", "b3", None, START + 170)]
EXPECTED = {("job-a", "straggler", "a2", "6"), ("job-b", "node_silent", "b3", None)}


def _firing(values: list[bytes]) -> list[dict[str, Any]]:
    return [d for d in map(decode_detection, values) if d["state"] == "firing"]


def _all_expected(values: list[bytes]) -> bool:
    """Every expected incident has fired: the two jobs' detections sit in different
    partitions, so waiting for the last one alone could stop before the other's
    partition was read (it did once, on a loaded machine)."""
    return EXPECTED <= {(d["job"], d["kind"], d["node"], d["gpu"]) for d in _firing(values)}


def _assert_each_incident_once(values: list[bytes], log: Path) -> None:
    firing = _firing(values)
    blamed = Counter((d["job"], d["kind"], d["node"], d["gpu"]) for d in firing)
    assert set(blamed) == EXPECTED, log_excerpt(log)
    assert all(n == 1 for n in blamed.values()), f"an incident fired twice: {blamed}"
    assert len({d["id"] for d in firing}) == len(EXPECTED)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def test_worker_sigkilled_twice_in_a_row(isolated_env: dict[str, str], isolated_cfg: Config,
                                        tmp_path: Path) -> None:
    env = dict(isolated_env, VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="8")
    samples = list(Simulator(Cluster(JOBS, FAULTS), START, seed=4).samples(260))
    cut = next(i for i, s in enumerate(samples) if s["ts"] >= START + 150)
    publish(isolated_cfg, samples[:cut])
    first = start_worker(env, str(tmp_path / "worker-1.log"))
    try:
        seen = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 150, first)
        assert _firing(seen), log_excerpt(tmp_path / "worker-1.log")
        publish(isolated_cfg, samples[cut:cut + 200])
    finally:
        _kill(first)
    second = start_worker(env, str(tmp_path / "worker-2.log"))
    try:
        time.sleep(20)  # it joins, recovers the table, processes a little ...
        publish(isolated_cfg, samples[cut + 200:cut + 400])
    finally:
        _kill(second)  # ... and dies too
    publish(isolated_cfg, samples[cut + 400:])
    third = start_worker(env, str(tmp_path / "worker-3.log"))
    try:
        values = read_topic(isolated_cfg, topics.DETECTIONS,
                            _all_expected,
                            240, third)
    finally:
        third.send_signal(signal.SIGTERM)
        third.wait(timeout=60)
    _assert_each_incident_once(values, tmp_path / "worker-3.log")


def test_broker_restart_while_agents_publish_and_a_worker_consumes(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    svc = localstack.services(isolated_cfg).get("kafka")
    assert svc is not None and svc.pid() is not None, "needs the local stack's broker"
    ensure_topics(isolated_cfg)
    env = dict(isolated_env, VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="10")
    samples = list(Simulator(Cluster(JOBS, FAULTS), START, seed=4).samples(260))
    agent = BufferedPublisher(isolated_cfg.kafka_bootstrap,
                              topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix))
    worker = start_worker(env, str(tmp_path / "worker.log"))
    try:
        third = len(samples) // 3
        for s in samples[:third]:
            agent.publish(s)
        assert agent.flush(60)
        seen = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 150, worker)
        assert _firing(seen), log_excerpt(tmp_path / "worker.log")  # it is running
        svc.stop()  # the broker goes away mid-run ...
        for s in samples[third:2 * third]:
            agent.publish(s)  # ... the agents keep sampling into their buffers
        time.sleep(5)
        localstack.start_kafka(isolated_cfg, svc)
        for s in samples[2 * third:]:
            agent.publish(s)
        assert agent.close(timeout=120), f"agent did not catch up: {agent.buffered} left"
        assert agent.dropped == 0 and agent.published == len(samples)
        values = read_topic(isolated_cfg, topics.DETECTIONS,
                            _all_expected,
                            240, worker)
        assert worker.poll() is None, "the worker died with the broker"
    finally:
        if svc.pid() is None:
            localstack.start_kafka(isolated_cfg, svc)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    _assert_each_incident_once(values, tmp_path / "worker.log")
