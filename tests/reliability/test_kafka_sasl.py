"""Every Kafka client through a broker that requires SASL/SCRAM: agent publisher,
admin, Faust worker, alerter and the CLI's consumer. A wrong password is refused."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.kafka_helpers import pipeline_through, refused
from tests.integration.ports import free_port
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.vigil.ops import localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

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
    assert pipeline_through(env, "s1", "4", START, tmp_path / "worker.log") == [("s1", "4")]
    log = (tmp_path / "worker.log").read_text()
    assert sasl_broker["VIGIL_KAFKA_SASL_PASSWORD"] not in log


def test_a_wrong_password_is_refused(sasl_broker: dict[str, str]) -> None:
    assert refused(load(env=dict(sasl_broker, VIGIL_KAFKA_SASL_PASSWORD="wrong")))
    assert refused(load(env=dict(sasl_broker, VIGIL_KAFKA_SECURITY_PROTOCOL="PLAINTEXT")))
    ensure_topics(load(env=sasl_broker))  # same broker, right password: fine
