"""Every Kafka client through a broker that speaks only TLS and requires client
certificates (mutual TLS), with a CA made here by openssl: agent publisher, admin,
Faust worker and alerter. A client that does not trust the broker's CA, one that
trusts another CA, and one without a client certificate are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.kafka_helpers import pipeline_through, refused
from tests.integration.ports import free_port
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.vigil.ops import localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

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
    assert pipeline_through(env, "t3", "1", START, tmp_path / "worker.log") == [("t3", "1")]


def test_clients_without_the_ca_or_a_certificate_are_refused(
        tls_broker: dict[str, str], tmp_path: Path) -> None:
    other_ca = localstack.tls_files(tmp_path / "other").ca
    clients = {
        "the system's CAs only": {"VIGIL_KAFKA_SSL_CAFILE": ""},
        "another CA": {"VIGIL_KAFKA_SSL_CAFILE": str(other_ca)},
        "no client certificate": {"VIGIL_KAFKA_SSL_CERTFILE": "", "VIGIL_KAFKA_SSL_KEYFILE": ""},
        "plain text": {"VIGIL_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"},
    }
    for why, change in clients.items():  # the handshake fails: bootstrapping gives up
        assert refused(load(env={**tls_broker, **change})), f"a client with {why} got in"
    ensure_topics(load(env=tls_broker))  # the same broker, the right CA and certificate
