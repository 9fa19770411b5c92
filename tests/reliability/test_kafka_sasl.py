"""Every Kafka client through a broker that requires SASL/SCRAM: agent publisher,
admin, Faust worker, alerter and the CLI's consumer. A wrong password is refused."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer
from kafka.errors import KafkaError

from alerting.state import LiveState
from contracts import topics
from contracts.codec import decode_detection
from contracts.config import Config, load
from producers.publisher import BufferedPublisher
from producers.simulator import Cluster, Fault, JobSpec, Simulator
from tests.integration.kafka_helpers import start_worker
from tests.integration.ports import free_port
from vigil import localstack
from vigil.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
START = 1_895_000_000.0


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A second local broker that accepts only SASL_PLAINTEXT with SCRAM-SHA-512."""
    data = tmp_path_factory.mktemp("sasl-stack")
    password = secrets.token_urlsafe(16)
    env = {"VIGIL_LOCAL_DATA_DIR": str(data), "VIGIL_LOCAL_KAFKA_PORT": str(free_port()),
           "VIGIL_LOCAL_CONTROLLER_PORT": str(free_port()), "VIGIL_LOCAL_KAFKA_SASL": "true",
           "VIGIL_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "VIGIL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "VIGIL_KAFKA_SASL_USERNAME": "vigil", "VIGIL_KAFKA_SASL_PASSWORD": password}
    cfg = load(env=env)
    svc = localstack.services(cfg)["kafka"]
    localstack.start_kafka(cfg, svc)
    try:
        yield env
    finally:
        svc.stop()


def test_the_pipeline_runs_through_sasl(sasl_broker: dict[str, str],
                                        isolated_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(isolated_env, **sasl_broker)
    env.pop("VIGIL_KAFKA_BOOTSTRAP", None)  # the SASL broker, not the test stack's
    cfg: Config = load(env=env)
    assert cfg.kafka_client["security_protocol"] == "SASL_PLAINTEXT"
    ensure_topics(cfg)  # the admin client authenticates
    job = JobSpec("sasl-job", [f"s{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("slow_gpu", job.name, "s1", "4", START + 40)])
    agent = BufferedPublisher(cfg.kafka_bootstrap,
                              topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                              **cfg.kafka_client)
    for sample in Simulator(cluster, START, seed=5).samples(130):
        agent.publish(sample)
    assert agent.close(timeout=60) and agent.dropped == 0 and not agent.errors
    worker = start_worker(env, str(tmp_path / "worker.log"))
    try:
        consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                                 bootstrap_servers=cfg.kafka_bootstrap,
                                 auto_offset_reset="earliest", consumer_timeout_ms=1000,
                                 **cfg.kafka_client)
        found: list[dict[str, object]] = []
        for _ in range(150):
            found.extend(decode_detection(r.value) for r in consumer)
            if found or worker.poll() is not None:
                break
        consumer.close()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert [(d["node"], d["gpu"]) for d in found if d["state"] == "firing"] == [("s1", "4")], (
        (tmp_path / "worker.log").read_text()[-3000:])
    subprocess.run([sys.executable, "-m", "vigil.cli", "alerter", "--max-seconds", "15"],
                   env=env, check=True, timeout=90)
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    assert [(d["node"], d["gpu"]) for d in state.open_incidents()] == [("s1", "4")]
    log = (tmp_path / "worker.log").read_text()
    assert sasl_broker["VIGIL_KAFKA_SASL_PASSWORD"] not in log


def test_a_wrong_password_is_refused(sasl_broker: dict[str, str]) -> None:
    with pytest.raises(KafkaError):  # kafka-python gives up bootstrapping
        ensure_topics(load(env=dict(sasl_broker, VIGIL_KAFKA_SASL_PASSWORD="wrong")))
    with pytest.raises(KafkaError):  # nor does plain text get in
        ensure_topics(load(env=dict(sasl_broker, VIGIL_KAFKA_SECURITY_PROTOCOL="PLAINTEXT")))
    ensure_topics(load(env=sasl_broker))  # same broker, right password: fine
