"""Secrets never reach the logs, even at debug level and when deliveries fail."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from urllib.parse import urlsplit

import pytest
import redis
from kafka import KafkaProducer

from tests.alerting.test_delivery import det
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_detection
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration


def test_secrets_stay_out_of_logs(isolated_env: dict[str, str], isolated_cfg: Config) -> None:
    secrets = {name: f"s3cr3t-{name}-{uuid.uuid4().hex[:8]}"
               for name in ("slack", "pagerduty", "webhook", "redis")}
    admin = redis.Redis.from_url(isolated_cfg.redis_url)
    user = f"vigil-{uuid.uuid4().hex[:6]}"
    admin.execute_command("ACL", "SETUSER", user, "on", f">{secrets['redis']}", "~*", "&*",
                          "+@all")
    parts = urlsplit(isolated_cfg.redis_url)
    env = dict(isolated_env,
               VIGIL_REDIS_URL=f"redis://{user}:{secrets['redis']}@{parts.hostname}:{parts.port}/0",
               VIGIL_ALERTER_SLACK_WEBHOOK=f"http://127.0.0.1:9/services/{secrets['slack']}",
               VIGIL_ALERTER_PAGERDUTY_ROUTING_KEY=secrets["pagerduty"],
               VIGIL_ALERTER_PAGERDUTY_URL="http://127.0.0.1:9/v2/enqueue",
               VIGIL_ALERTER_WEBHOOK_URL="http://127.0.0.1:9/hook",
               VIGIL_ALERTER_WEBHOOK_SECRET=secrets["webhook"],
               VIGIL_ALERTER_PAGE_AFTER_SECONDS="0", VIGIL_ALERTER_MAX_ATTEMPTS="2",
               VIGIL_KAFKA_SASL_PASSWORD="s3cr3t-kafka")
    ensure_topics(isolated_cfg)
    producer = KafkaProducer(bootstrap_servers=isolated_cfg.kafka_bootstrap)
    producer.send(topics.topic(topics.DETECTIONS, isolated_cfg.kafka.topic_prefix),
                  key=b"job-7", value=encode_detection(dict(det(), detected_at=time.time())))
    producer.flush()
    producer.close()
    try:
        runs = [subprocess.run([sys.executable, "-m", "vigil_gpu_monitor", "-v", *args], env=env,
                               capture_output=True, text=True, timeout=120)
                for args in (["alerter", "--max-seconds", "12"], ["config"])]
    finally:
        admin.execute_command("ACL", "DELUSER", user)
    output = "".join(r.stdout + r.stderr for r in runs)
    assert "dead_letter" in output or "127.0.0.1:9" in output or "retry" in output, \
        "the run did not exercise failing deliveries"
    for value in [*secrets.values(), "s3cr3t-kafka"]:
        assert value not in output, f"a secret leaked into the logs: {value[:10]}..."
    assert runs[0].returncode == 0, runs[0].stderr[-2000:]
