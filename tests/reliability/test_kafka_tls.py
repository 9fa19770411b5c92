"""Every Kafka client through a broker that speaks only TLS and requires client
certificates (mutual TLS), with a CA made here by openssl: agent publisher, admin,
Faust worker and alerter. A client that does not trust the broker's CA, one that
trusts another CA, and one without a client certificate are refused."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient
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
START = 1_897_000_000.0


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A second local broker with one SSL listener requiring client certificates; the
    environment of a client holding the CA and a client certificate."""
    data = tmp_path_factory.mktemp("tls-stack")
    broker_env = {"VIGIL_LOCAL_DATA_DIR": str(data), "VIGIL_LOCAL_KAFKA_PORT": str(free_port()),
                  "VIGIL_LOCAL_CONTROLLER_PORT": str(free_port()),
                  "VIGIL_LOCAL_KAFKA_TLS": "mutual"}
    cfg = load(env=broker_env)
    svc = localstack.services(cfg)["kafka"]
    localstack.start_kafka(cfg, svc)
    files = localstack.tls_files(svc.datadir / "tls")
    try:
        yield {**broker_env, "VIGIL_KAFKA_SECURITY_PROTOCOL": "SSL",
               "VIGIL_KAFKA_SSL_CAFILE": str(files.ca),
               "VIGIL_KAFKA_SSL_CERTFILE": str(files.client_cert),
               "VIGIL_KAFKA_SSL_KEYFILE": str(files.client_key)}
    finally:
        svc.stop()


def test_the_pipeline_runs_through_mutual_tls(tls_broker: dict[str, str],
                                              isolated_env: dict[str, str],
                                              tmp_path: Path) -> None:
    env = dict(isolated_env, **tls_broker)
    env.pop("VIGIL_KAFKA_BOOTSTRAP", None)  # the TLS broker, not the test stack's
    cfg: Config = load(env=env)
    assert cfg.kafka_client["security_protocol"] == "SSL"
    ensure_topics(cfg)  # the admin client verifies the broker and shows its certificate
    job = JobSpec("tls-job", [f"t{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("slow_gpu", job.name, "t3", "1", START + 40)])
    agent = BufferedPublisher(cfg.kafka_bootstrap,
                              topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                              **cfg.kafka_client)
    for sample in Simulator(cluster, START, seed=6).samples(130):
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
    assert [(d["node"], d["gpu"]) for d in found if d["state"] == "firing"] == [("t3", "1")], (
        (tmp_path / "worker.log").read_text()[-3000:])
    subprocess.run([sys.executable, "-m", "vigil.cli", "alerter", "--max-seconds", "15"],
                   env=env, check=True, timeout=90)
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    assert [(d["node"], d["gpu"]) for d in state.open_incidents()] == [("t3", "1")]


def test_clients_without_the_ca_or_a_certificate_are_refused(
        tls_broker: dict[str, str], tmp_path: Path) -> None:
    other_ca = localstack.tls_files(tmp_path / "other").ca
    refused = {
        "the system's CAs only": {"VIGIL_KAFKA_SSL_CAFILE": ""},
        "another CA": {"VIGIL_KAFKA_SSL_CAFILE": str(other_ca)},
        "no client certificate": {"VIGIL_KAFKA_SSL_CERTFILE": "", "VIGIL_KAFKA_SSL_KEYFILE": ""},
        "plain text": {"VIGIL_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"},
    }
    for why, change in refused.items():
        cfg = load(env={**tls_broker, **change})
        with pytest.raises(KafkaError):  # the handshake fails: bootstrapping gives up
            KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap, bootstrap_timeout_ms=5000,
                             **cfg.kafka_client).close()
            pytest.fail(f"a client with {why} got in")
    ensure_topics(load(env=tls_broker))  # the same broker, the right CA and certificate
