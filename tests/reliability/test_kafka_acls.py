"""Roles on the broker (issue #49): a local broker with KRaft's StandardAuthorizer and
one SCRAM principal per role (`vigil up` with ``local.kafka_acls``). An agent's
principal is refused on ``vigil.detections`` and ``vigil.actions``; a reader's may
not write detections; and the roles, each with its own principal, still run the
pipeline end to end: agent → worker → alerter (an action on ``vigil.actions``) →
a reader of detections."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError, TopicAuthorizationFailedError

from tests.integration.kafka_helpers import VIGIL, read_topic, start_worker
from tests.integration.ports import free_port
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_detection
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.producers.publisher import BufferedPublisher
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops import kafka_acls, localstack
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
START = 1_897_000_000.0


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A second local broker: SASL/SCRAM, the authorizer on, a principal per role."""
    data = tmp_path_factory.mktemp("acl-stack")
    env = {"VIGIL_LOCAL_DATA_DIR": str(data), "VIGIL_LOCAL_KAFKA_PORT": str(free_port()),
           "VIGIL_LOCAL_CONTROLLER_PORT": str(free_port()), "VIGIL_LOCAL_KAFKA_SASL": "true",
           "VIGIL_LOCAL_KAFKA_ACLS": "true",
           "VIGIL_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "VIGIL_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "VIGIL_KAFKA_SASL_USERNAME": "vigil",
           "VIGIL_KAFKA_SASL_PASSWORD": secrets.token_urlsafe(16)}
    cfg = load(env=env)
    svc = localstack.services(cfg)["kafka"]
    localstack.start_kafka(cfg, svc)
    try:
        yield env
    finally:
        svc.stop()


def as_role(env: dict[str, str], role: str) -> dict[str, str]:
    """``env`` with the role's principal instead of the admin's."""
    return dict(env, VIGIL_KAFKA_SASL_USERNAME=kafka_acls.principal(role),
                VIGIL_KAFKA_SASL_PASSWORD=kafka_acls.role_password(
                    env["VIGIL_KAFKA_SASL_PASSWORD"], role))


@pytest.fixture
def admin_env(acl_broker: dict[str, str], isolated_env: dict[str, str]) -> dict[str, str]:
    """This test's own topics and groups on the ACL broker, their ACLs written by the
    admin (as `vigil up` does for the default names)."""
    env = dict(isolated_env, **acl_broker)
    env.pop("VIGIL_KAFKA_BOOTSTRAP", None)
    cfg = load(env=env)
    ensure_topics(cfg)
    assert kafka_acls.apply(cfg) > 0
    return env


def send(env: dict[str, str], topic: str, value: bytes) -> None:
    cfg = load(env=env)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all",
                             max_block_ms=10_000, **cfg.kafka_client)
    try:
        producer.send(topics.topic(topic, cfg.kafka.topic_prefix), key=b"j",
                      value=value).get(timeout=15)
    finally:
        producer.close(timeout=5)


def detection(node: str) -> bytes:
    return encode_detection({
        "schema": "vigil.detection/1", "id": f"forged-{node}", "kind": "gpu_health",
        "state": "firing", "severity": "critical", "job": "j", "node": node, "gpu": "0",
        "started_at": START, "detected_at": START, "metrics": ["xid"], "score": 9.0,
        "summary": "forged", "evidence": {"action": "replace"}})


def test_an_agent_cannot_write_detections_or_actions(admin_env: dict[str, str]) -> None:
    agent = as_role(admin_env, "agent")
    for topic, value in ((topics.DETECTIONS, detection("gpu-01")),
                         (topics.ACTIONS, json.dumps({"action": "drain"}).encode())):
        with pytest.raises(TopicAuthorizationFailedError):
            send(agent, topic, value)
    with pytest.raises(KafkaError):  # nor read what the worker says
        consumer = KafkaConsumer(
            topics.topic(topics.DETECTIONS, load(env=agent).kafka.topic_prefix),
            group_id="vigil-reader-x", consumer_timeout_ms=5000,
            **{"bootstrap_servers": load(env=agent).kafka_bootstrap,
               **load(env=agent).kafka_client})
        try:
            list(consumer)
        finally:
            consumer.close()
    # a reader only reads (its producer is refused before the topic: it may write
    # nothing at all, so even its idempotent producer id is a cluster refusal)
    with pytest.raises(KafkaError, match="Authorization"):
        send(as_role(admin_env, "reader"), topics.DETECTIONS, detection("gpu-02"))
    landed = read_topic(load(env=admin_env), topics.DETECTIONS, lambda v: False, 3)
    landed += read_topic(load(env=admin_env), topics.ACTIONS, lambda v: False, 3)
    assert landed == []


def test_each_role_with_its_own_principal_runs_the_pipeline(admin_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    agent_env, worker_env = as_role(admin_env, "agent"), as_role(admin_env, "worker")
    alerter_env = dict(as_role(admin_env, "alerter"),
                       VIGIL_ALERTER_REMEDIATION_ENABLED="true",
                       VIGIL_ALERTER_CONFIRM_SECONDS="0", VIGIL_ALERTER_MAX_JOB_SHARE="1.0",
                       VIGIL_ALERTER_MAX_FLEET_SHARE="1.0", VIGIL_ALERTER_FLEET_NODES="4")
    cfg = load(env=agent_env)
    job = JobSpec("acl-job", [f"a{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("xid", job.name, "a2", "6", START + 40, severity=79.0)])
    agent = BufferedPublisher(cfg.kafka_bootstrap,
                              topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                              **cfg.kafka_client)
    for sample in Simulator(cluster, START, seed=11).samples(90):
        agent.publish(sample)
    assert agent.close(timeout=60) and agent.dropped == 0 and not agent.errors, agent.errors

    worker = start_worker(worker_env, str(tmp_path / "worker.log"))
    try:
        dets = read_topic(load(env=as_role(admin_env, "reader")), topics.DETECTIONS, lambda v: any(
            decode_detection(x)["kind"] == "gpu_health" for x in v), 120, worker)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    log = (tmp_path / "worker.log").read_text()[-3000:]
    assert ("a2", "6") in {(d["node"], d["gpu"]) for d in map(decode_detection, dets)}, log
    assert "AuthorizationFailed" not in log and "authoriz" not in log.lower(), log

    done = subprocess.run([*VIGIL, "alerter", "--max-seconds", "15"], env=alerter_env,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and "uthoriz" not in done.stderr, done.stderr[-3000:]
    actions = read_topic(load(env=as_role(admin_env, "reader")), topics.ACTIONS,
                         lambda v: len(v) >= 1, 30)
    assert [(a["node"], a["decision"]) for a in map(json.loads, actions)] == [
        ("a2", "dry_run")]

    rcfg = load(env=as_role(admin_env, "reader"))
    consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, rcfg.kafka.topic_prefix),
                             bootstrap_servers=rcfg.kafka_bootstrap,
                             group_id=f"{kafka_acls.READER_GROUP_PREFIX}-dashboard",
                             auto_offset_reset="earliest", consumer_timeout_ms=5000,
                             **rcfg.kafka_client)
    try:
        read = [decode_detection(r.value) for r in consumer]
    finally:
        consumer.close()
    assert any(d["node"] == "a2" for d in read)


def test_the_deploy_script_is_the_table() -> None:
    script = Path(__file__).resolve().parents[2] / "deploy" / "kafka" / "acls.sh"
    assert script.read_text() == kafka_acls.script(load(env={})), (
        "deploy/kafka/acls.sh is stale: "
        "python -m vigil_gpu_monitor.vigil.ops.kafka_acls > deploy/kafka/acls.sh")
