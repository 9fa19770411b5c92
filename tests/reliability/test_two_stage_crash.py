"""Crash equals replay across the two stages of a sharded job (issue #46,
docs/sharding.md): a job's samples keyed by shard (``job#k/K``) through
``vigil worker --stage 1`` and ``--stage 2`` give exactly one-stage replay's
detections; so they do when the stage-1 worker, or separately the stage-2 worker,
is SIGKILLed mid-trace and started again.

As for one stage, a detection sent after the last checkpoint may be sent again (the
same id, state and time twice is one detection). The trace has no clock off by
more than a second: over Kafka each shard places clocks and seals by its own
samples (docs/sharding.md says where that differs from one stage)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from tests.integration.kafka_helpers import log_excerpt, read_topic, start_worker
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.shards import shard_key
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.producers.publisher import ShardPartitioner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
START = 1_893_100_000.0
SHARDS = 2
NODES = [f"ts{i}" for i in range(6)]  # crc32 mod 2: four in shard 1, two in shard 0
FAULTS = [Fault("slow_gpu", "two", NODES[0], "3", START + 90, severity=1.3),
          Fault("xid", "two", NODES[3], "2", START + 150),
          Fault("thermal", "two", NODES[4], "5", START + 110)]

Key = tuple[str, str, str, float]


def _keys(detections: list[dict[str, Any]]) -> set[Key]:
    return {(d["id"], d["kind"], d["state"], d["detected_at"]) for d in detections}


def _publish(cfg: Config, samples: list[dict[str, Any]]) -> None:
    """Samples keyed as the agent keys a sharded job's: ``job#k/K``."""
    ensure_topics(cfg)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all",
                             partitioner=ShardPartitioner())
    name = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    for s in samples:
        producer.send(name, key=shard_key(s["job"], s["node"], SHARDS).encode(),
                      value=encode_sample(s))
    producer.flush()
    producer.close()


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=60)


@pytest.mark.parametrize("killed", [1, 2])
def test_a_stage_killed_mid_trace_publishes_what_replay_gives(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path,
        killed: int) -> None:
    cluster = Cluster([JobSpec("two", NODES)], FAULTS, skew_seconds=0.5, loss=0.0,
                      reorder_seconds=1.0)
    samples = list(Simulator(cluster, START, seed=4).samples(300))
    runner = ReplayRunner(isolated_cfg.detect)
    expected = _keys([d for s in samples for d in runner.feed(s)])
    assert {k[1] for k in expected} == {"straggler", "gpu_health"}, expected
    cut = next(i for i, s in enumerate(samples) if s["ts"] >= START + 140)
    _publish(isolated_cfg, samples[:cut])
    env = dict(isolated_env, VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="8")
    procs = {1: start_worker(env, tmp_path / "stage1-a.log", stage=1),
             2: start_worker(env, tmp_path / "stage2-a.log", stage=2)}
    try:
        seen = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 150,
                          procs[2])
        logs = {k: log_excerpt(tmp_path / f"stage{k}-a.log") for k in (1, 2)}
        assert seen, logs
        procs[killed].send_signal(signal.SIGKILL)  # ... dies without a goodbye
        procs[killed].wait(timeout=30)
        _publish(isolated_cfg, samples[cut:])
        procs[killed] = start_worker(env, tmp_path / f"stage{killed}-b.log", stage=killed)
        values = read_topic(isolated_cfg, topics.DETECTIONS,
                            lambda v: _keys([decode_detection(x) for x in v]) >= expected,
                            240, procs[2])
    finally:
        for proc in procs.values():
            _stop(proc)
    published = _keys([decode_detection(v) for v in values])
    log = "\n".join(log_excerpt(p, 1500) for p in sorted(tmp_path.glob("stage*.log")))
    assert published - expected == set(), f"not in replay: {published - expected}\n{log}"
    assert expected - published == set(), f"missing: {expected - published}\n{log}"
