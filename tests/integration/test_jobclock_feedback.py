"""The job-clock feedback over the real Kafka (issue #46, docs/sharding.md): a
4-node job in 4 shards, one node a shard, skewed clocks; one node falls silent, so
its shard gets no sample any more. Without the feedback stage 2 waits for that shard
for ever; with it, stage 2 sends ``vigil.jobclock/1`` on the compacted topic, every
stage-1 worker reads it, and the quiet shard's timer seals its bins by the job's
watermark: the silent node is found at the bin one stage finds it."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

from tests.integration.kafka_helpers import log_excerpt, read_topic, start_worker
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.jobclock import decode_jobclock
from vigil_gpu_monitor.contracts.shards import shard_key, shard_of
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.producers.publisher import ShardPartitioner
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
START = 1_893_200_000.0
SHARDS = 4
NODES = ["a-0", "a-1", "a-4", "a-5"]  # crc32 mod 4: one node a shard


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def _logs(folder: Path) -> str:
    return "\n".join(log_excerpt(p, 2000) for p in sorted(folder.glob("stage*.log")))


def _found(detections: list[dict[str, Any]]) -> set[tuple[str, str, float]]:
    return {(d["kind"], d["node"], d["detected_at"]) for d in detections
            if d["state"] == "firing"}


def test_a_silent_shard_is_sealed_by_the_fed_back_watermark_over_kafka(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    assert len({shard_of(n, SHARDS) for n in NODES}) == SHARDS
    cluster = Cluster([JobSpec("fed", NODES)], [Fault("node_silent", "fed", NODES[0], None,
                                                      START + 40)], skew_seconds=1.0)
    samples = list(Simulator(cluster, START, seed=3).samples(100))
    replay = ReplayRunner(isolated_cfg.detect)
    expected = _found([dict(d) for s in samples for d in replay.feed(s)])
    assert expected == {("node_silent", NODES[0], START + 50)}, expected

    ensure_topics(isolated_cfg)
    producer = KafkaProducer(bootstrap_servers=isolated_cfg.kafka_bootstrap, acks="all",
                             partitioner=ShardPartitioner())
    name = topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix)
    for s in samples:
        producer.send(name, key=shard_key("fed", s["node"], SHARDS).encode(),
                      value=encode_sample(s))
    producer.flush()
    producer.close()
    procs = [start_worker(isolated_env, tmp_path / "stage1.log", stage=1),
             start_worker(isolated_env, tmp_path / "stage2.log", stage=2)]
    try:
        values = read_topic(isolated_cfg, topics.DETECTIONS,
                            lambda v: _found([dict(decode_detection(x)) for x in v]) >= expected,
                            120, procs[1])
        clocks = read_topic(isolated_cfg, topics.JOBCLOCK, lambda v: len(v) >= 1, 30)
    finally:
        _stop(procs)
    log = _logs(tmp_path)
    assert _found([dict(decode_detection(v)) for v in values]) == expected, log
    # the agents' partitioner put the job's four shards on four partitions
    consumer = KafkaConsumer(name, bootstrap_servers=isolated_cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=2000)
    try:
        placed = {(r.key, r.partition) for r in consumer}
    finally:
        consumer.close()
    assert len(placed) == SHARDS and len({p for _, p in placed}) == SHARDS, placed
    last = decode_jobclock(clocks[-1])
    assert last["job"] == "fed" and last["shards"] == SHARDS and last["voters"] == len(NODES)
    admin = KafkaAdminClient(bootstrap_servers=isolated_cfg.kafka_bootstrap)
    try:
        jobclock = topics.topic(topics.JOBCLOCK, isolated_cfg.kafka.topic_prefix)
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, jobclock)])
        assert "compact" in str(described)
    finally:
        admin.close()


def test_a_silent_shard_left_behind_by_a_stage1_crash_is_revived_over_kafka(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    """The same job; stage 1 SIGKILLed once the silent node is found, the other
    nodes' next 80 s published, stage 1 started again: the silent node's shard has
    no sample to make it live, so only ``Stage1Processor.revive_stalling`` brings it
    back from its checkpoint, and stage 2 goes on evaluating the job."""
    cluster = Cluster([JobSpec("rev", NODES)], [Fault("node_silent", "rev", NODES[0], None,
                                                      START + 40)], skew_seconds=1.0)
    samples = list(Simulator(cluster, START, seed=3).samples(170))
    cut = next(i for i, s in enumerate(samples) if s["ts"] >= START + 80)
    ensure_topics(isolated_cfg)
    name = topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix)

    def publish(part: list[dict[str, Any]]) -> None:
        producer = KafkaProducer(bootstrap_servers=isolated_cfg.kafka_bootstrap, acks="all",
                             partitioner=ShardPartitioner())
        for s in part:
            producer.send(name, key=shard_key("rev", s["node"], SHARDS).encode(),
                          value=encode_sample(s))
        producer.flush()
        producer.close()

    def evaluated_past(t: float) -> Any:
        return lambda v: any(c["job"] == "rev" and c["next_bin"] is not None
                             and c["next_bin"] * 5.0 > t
                             for c in (decode_jobclock(x) for x in v))

    publish(samples[:cut])
    env = dict(isolated_env, VIGIL_WORKER_SESSION_TIMEOUT_SECONDS="8")
    procs = [start_worker(env, tmp_path / "stage1-a.log", stage=1),
             start_worker(env, tmp_path / "stage2.log", stage=2)]
    try:
        silent = read_topic(isolated_cfg, topics.DETECTIONS,
                            lambda v: any(d["kind"] == "node_silent"
                                          for d in (decode_detection(x) for x in v)), 120,
                            procs[1])
        assert procs[1].poll() is None, _logs(tmp_path)  # stage 2 alive to the end
        assert any(decode_detection(x)["kind"] == "node_silent" for x in silent), _logs(tmp_path)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=30)
        publish(samples[cut:])
        procs[0] = start_worker(env, tmp_path / "stage1-b.log", stage=1)
        clocks = read_topic(isolated_cfg, topics.JOBCLOCK, evaluated_past(START + 140), 150,
                            procs[1])
    finally:
        _stop(procs)
    log = _logs(tmp_path)
    assert evaluated_past(START + 140)(clocks), log
