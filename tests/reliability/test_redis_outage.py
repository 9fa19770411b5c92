"""Redis down for 30 s: the alerter keeps telling people (once each), then writes
everything Redis missed — incidents and the delivery log — and commits."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer

from tests.alerting.http_recorder import Recorder
from tests.alerting.test_delivery import det
from vigil_gpu_monitor.alerting.service import Alerter, build_channels
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_detection
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.vigil.ops import localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
OUTAGE_SECONDS = 30.0


def _publish(cfg: Config, dets: list[dict[str, Any]]) -> None:
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    for d in dets:
        producer.send(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                      key=d["job"].encode(), value=encode_detection(d))
    producer.flush()
    producer.close()


def _poll_until(alerter: Alerter, until: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until():
        alerter.poll_once(timeout_ms=300)


def test_redis_outage_keeps_delivering_and_catches_up(isolated_env: dict[str, str]) -> None:
    with Recorder() as hook:
        cfg = load(env=dict(isolated_env, VIGIL_ALERTER_WEBHOOK_URL=hook.url,
                            VIGIL_ALERTER_WEBHOOK_SECRET="k"))
        svc = localstack.services(cfg).get("redis")
        assert svc is not None and svc.pid() is not None, "needs the local stack's Redis"
        ensure_topics(cfg)
        now = time.time()
        first = dict(det(ident="inc-1"), started_at=now - 90, detected_at=now - 80)
        during = [dict(det(ident=f"inc-{i}", job=f"job-{i}"), started_at=now - 30,
                       detected_at=now - 20) for i in (2, 3)]
        consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                                 bootstrap_servers=cfg.kafka_bootstrap,
                                 group_id=cfg.alerter.group_id, enable_auto_commit=False,
                                 auto_offset_reset="earliest")
        state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
        alerter = Alerter(cfg, consumer, state, build_channels(cfg))
        try:
            _publish(cfg, [first])
            _poll_until(alerter, lambda: len(hook.requests) >= 1)
            svc.stop()  # Redis goes away for half a minute
            down_at = time.monotonic()
            _publish(cfg, [first, *during, during[0]])  # a redelivery, two new, a duplicate
            _poll_until(alerter, lambda: len(hook.requests) >= 3)
            told_during_outage = len(hook.requests)
            assert alerter.outage.ongoing, "the outage was not noticed"
            while time.monotonic() - down_at < OUTAGE_SECONDS:
                alerter.poll_once(timeout_ms=500)  # the loop survives the whole outage
            localstack.start_redis(cfg, svc)
            _poll_until(alerter, lambda: not alerter.outage.owed)
        finally:
            if svc.pid() is None:
                localstack.start_redis(cfg, svc)
            alerter.close()
            consumer.close()
    assert told_during_outage == 3  # people heard of the new incidents while Redis was down
    assert sorted(r.json()["id"] for r in hook.requests) == ["inc-1", "inc-2", "inc-3"]
    assert alerter.duplicates == 2 and alerter.applied == 3
    assert sorted(d["id"] for d in state.open_incidents()) == ["inc-1", "inc-2", "inc-3"]
    log = state.deliveries()
    assert sorted(e["incident"] for e in log if e["result"] == "delivered") == [
        "inc-1", "inc-2", "inc-3"]
    for d in during:
        assert state.told(d["job"], d["id"]) == {"webhook"}
    # Offsets were committed after the catch-up: a new alerter replays nothing new.
    replay = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                           bootstrap_servers=cfg.kafka_bootstrap, group_id=cfg.alerter.group_id,
                           enable_auto_commit=False, auto_offset_reset="earliest",
                           consumer_timeout_ms=3000)
    assert [r for r in replay] == []
    replay.close()
