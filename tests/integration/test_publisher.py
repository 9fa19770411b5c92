"""The agent's publisher across a real broker stop and start."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer

from vigil_gpu_monitor.contracts import SAMPLE_SCHEMA, topics
from vigil_gpu_monitor.contracts.codec import decode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.producers.publisher import BufferedPublisher
from vigil_gpu_monitor.producers.spool import DiskSpool
from vigil_gpu_monitor.vigil.ops import localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration


def _sample(i: int) -> dict[str, object]:
    return {"schema": SAMPLE_SCHEMA, "ts": 1_000_000.0 + i, "job": "job-pub", "node": "n1",
            "gpus": {"0": {"sm_active": 0.5}}, "host": {}, "nics": {}}


def _count(cfg: Config, expect: int, timeout: float = 60) -> list[float]:
    consumer = KafkaConsumer(topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap,
                             auto_offset_reset="earliest", consumer_timeout_ms=1000)
    seen: list[float] = []
    deadline = time.monotonic() + timeout
    while len(seen) < expect and time.monotonic() < deadline:
        seen.extend(decode_sample(r.value)["ts"] for r in consumer)
    consumer.close()
    return seen


@pytest.fixture
def broker(isolated_cfg: Config) -> Iterator[localstack.Service]:
    """The local broker, which this test may stop; it is always started again."""
    svc = localstack.services(isolated_cfg).get("kafka")
    if svc is None or svc.pid() is None:
        pytest.skip("needs the local stack's broker (VIGIL_KAFKA_BOOTSTRAP points elsewhere)")
    ensure_topics(isolated_cfg)
    yield svc
    if svc.pid() is None:
        localstack.start_kafka(isolated_cfg, svc)


def _outage(cfg: Config, svc: localstack.Service, pub: BufferedPublisher, during: range,
            after: range) -> float:
    """Stop the broker, publish ``during`` (the sampling loop must not block), restart,
    publish ``after``. Returns the longest publish() call in seconds."""
    svc.stop()
    slowest = 0.0
    for i in during:
        t0 = time.monotonic()
        pub.publish(_sample(i))
        slowest = max(slowest, time.monotonic() - t0)
    time.sleep(3)  # the sender keeps failing and re-queueing meanwhile
    localstack.start_kafka(cfg, svc)
    for i in after:
        pub.publish(_sample(i))
    return slowest


def test_broker_outage_loses_nothing_while_the_buffer_has_room(
        isolated_cfg: Config, broker: localstack.Service) -> None:
    pub = BufferedPublisher(isolated_cfg.kafka_bootstrap,
                            topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix),
                            capacity=10_000)
    for i in range(100):
        pub.publish(_sample(i))
    assert pub.flush(30)
    slowest = _outage(isolated_cfg, broker, pub, range(100, 400), range(400, 500))
    assert pub.close(timeout=90), f"not flushed: buffered={pub.buffered} errors={pub.errors}"
    assert slowest < 0.05, "publish() blocked while Kafka was down"
    seen = _count(isolated_cfg, 500)
    assert pub.dropped == 0 and sorted(set(seen)) == [1_000_000.0 + i for i in range(500)]


def test_a_full_buffer_drops_the_oldest_and_counts_exactly(
        isolated_cfg: Config, broker: localstack.Service) -> None:
    pub = BufferedPublisher(isolated_cfg.kafka_bootstrap,
                            topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix),
                            capacity=50, max_in_flight=10)
    assert pub.flush(5)
    _outage(isolated_cfg, broker, pub, range(0, 200), range(200, 210))
    assert pub.close(timeout=90)
    seen = set(_count(isolated_cfg, 210 - pub.dropped))
    assert pub.dropped > 0
    assert len(seen) == 210 - pub.dropped  # every sample is either on Kafka or counted
    assert 1_000_000.0 + 209 in seen  # the newest survive; the oldest were dropped


def test_spool_takes_the_overflow_and_survives_a_restart_while_kafka_is_down(
        isolated_cfg: Config, tmp_path: Path) -> None:
    """Kafka unreachable: memory overflows to the disk spool, close() spills the rest;
    a new publisher on the same spool (the restarted agent) sends every sample."""
    topic = topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix)
    ensure_topics(isolated_cfg)
    with socket.socket() as s:  # a port with nobody behind it: Kafka "down"
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    down = BufferedPublisher(dead, topic, capacity=20, max_in_flight=5,
                             spool=DiskSpool(tmp_path / "spool", segment_bytes=4096))
    slowest = 0.0
    for i in range(300):
        t0 = time.monotonic()
        down.publish(_sample(i))
        slowest = max(slowest, time.monotonic() - t0)
    assert not down.close(timeout=2)  # nothing could be sent
    assert down.dropped == 0 and down.published == 0
    # blocked, it would wait on Kafka's timeouts (seconds); a loaded CI machine has
    # delayed one non-blocking call by 65 ms, so the bound is not 50 ms
    assert slowest < 0.5, "publish() blocked while spooling"
    spool = DiskSpool(tmp_path / "spool")
    # failed sends went back to memory, then to disk; the few still in flight at the
    # close went to disk too, and those read from the spool's current segment are on
    # it twice (at least once: a repeated sample changes nothing the detectors read)
    assert 300 <= len(spool) <= 300 + 5
    spooled = len(spool)
    up = BufferedPublisher(isolated_cfg.kafka_bootstrap, topic, capacity=20, spool=spool)
    assert up.close(timeout=60), f"not drained: buffered={up.buffered} errors={up.errors}"
    seen = _count(isolated_cfg, spooled)
    assert up.dropped == 0 and up.published == spooled
    assert sorted(set(seen)) == [1_000_000.0 + i for i in range(300)]
