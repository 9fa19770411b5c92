"""A sample speaks only for its node (issue #49), through real Kafka, `vigil worker`
and `vigil alerter` with ``identity.verify`` on: samples naming a node whose key did
not sign them (a node forging for another, an unsigned sender, an unknown key id)
are dead-lettered with their reason and counted on /metrics, never detected on, never
acted on; the nodes' own signed samples are detected and acted on as before."""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaProducer

from tests.integration.kafka_helpers import VIGIL, log_excerpt, read_topic, start_worker
from tests.integration.ports import free_port
from tests.integration.scrape import metric
from vigil_gpu_monitor.alerting.remediation import audit_log
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.contracts.identity import Signer, node_key
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
START = 1_860_000_000.0
MASTER = bytes(range(100, 132))


def test_a_forged_sample_is_dead_lettered_counted_and_never_acted_on(
        isolated_env: dict[str, str], tmp_path: Path) -> None:
    port = free_port()
    env = dict(isolated_env, VIGIL_IDENTITY_VERIFY="true",
               VIGIL_IDENTITY_MASTER_KEYS=f"k1={MASTER.hex()}",
               VIGIL_WORKER_WEB_PORT=str(port),
               VIGIL_ALERTER_REMEDIATION_ENABLED="true", VIGIL_ALERTER_CONFIRM_SECONDS="0",
               VIGIL_ALERTER_MAX_JOB_SHARE="1.0", VIGIL_ALERTER_MAX_FLEET_SHARE="1.0",
               VIGIL_ALERTER_FLEET_NODES="4", VIGIL_ALERTER_REPAIR_WATCH_SAMPLES="false")
    cfg = load(env=env)
    ensure_topics(cfg)
    # XID 79 on three nodes: id1's own (signed by id1), id2's forged by id0 (signed with
    # id0's key), id3's unsigned; one more for id2 under a key id no worker holds
    job = JobSpec("id-job", [f"id{i}" for i in range(4)])
    faults = [Fault("xid", job.name, node, gpu, START + 40, severity=79.0)
              for node, gpu in (("id1", "3"), ("id2", "5"), ("id3", "1"))]
    samples = list(Simulator(Cluster([job], faults), START, seed=7).samples(120))
    keys = {n: Signer("k1", node_key(MASTER, n)) for n in job.nodes}
    stranger = Signer("k9", node_key(MASTER, "id2"))
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    sent: Counter[str] = Counter()
    name = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    for i, sample in enumerate(samples):
        value = encode_sample(sample)
        headers: Any = keys[sample["node"]].headers(value)
        if sample["node"] == "id2":
            headers = (stranger if i % 10 == 0 else keys["id0"]).headers(value)
            sent["unknown_key" if i % 10 == 0 else "bad_signature"] += 1
        elif sample["node"] == "id3":
            headers = None
            sent["unsigned"] += 1
        producer.send(name, key=sample["job"].encode(), value=value, headers=headers)
    producer.flush()
    producer.close()
    refused = sum(sent.values())

    worker = start_worker(env, str(tmp_path / "worker.log"))
    try:
        dead = read_topic(cfg, topics.DEADLETTER, lambda v: len(v) >= refused, 120, worker)
        dets = read_topic(cfg, topics.DETECTIONS, lambda v: any(
            decode_detection(x)["kind"] == "gpu_health" for x in v), 60, worker)
        counted = {reason: metric(port, "vigil_worker_deadletters_total", reason=reason)
                   for reason in sent}
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    log = log_excerpt(tmp_path / "worker.log")
    assert Counter(json.loads(v)["reason"] for v in dead) == sent, log
    assert counted == {reason: float(n) for reason, n in sent.items()}, log
    firing = {(d["kind"], d["node"], d["gpu"]) for d in map(decode_detection, dets)
              if d["state"] == "firing"}
    assert ("gpu_health", "id1", "3") in firing, log
    assert not {d for d in firing if d[1] in ("id2", "id3")}, firing

    subprocess.run([*VIGIL, "alerter", "--max-seconds", "15"], env=env, check=True,
                   timeout=90)
    r = redis.Redis.from_url(cfg.redis_url)
    open_nodes = {d["node"] for d in LiveState(r, cfg.redis.key_prefix).open_incidents()}
    acted = {(a["node"], a["decision"]) for a in audit_log(r, cfg.redis.key_prefix)}
    assert "id1" in open_nodes and not open_nodes & {"id2", "id3"}
    assert acted == {("id1", "dry_run")}, acted


class _Record:
    def __init__(self, value: bytes, headers: Any) -> None:
        self.value, self.headers = value, headers


class _Samples:
    """The alerter's samples consumer seam (kafka-python's ``poll``)."""

    def __init__(self) -> None:
        self.batches: list[list[_Record]] = []

    def poll(self, timeout_ms: int = 0, max_records: int = 0) -> dict[str, list[_Record]]:
        return {"samples-0": self.batches.pop(0)} if self.batches else {}


def test_the_alerter_believes_a_gpu_swap_only_from_the_node_itself(
        isolated_cfg: Any) -> None:
    """A node Vigil drained awaits a GPU swap; a sample from another node's key that
    claims the swap (new ``meta.gpu_uuids``) starts nothing, the node's own does."""
    import dataclasses
    import time

    from tests.integration.test_remediation import health
    from vigil_gpu_monitor.alerting.repair import RepairLog
    from vigil_gpu_monitor.alerting.service import Alerter
    from vigil_gpu_monitor.contracts.config import IdentityConfig, Secret

    cfg = dataclasses.replace(
        isolated_cfg,
        identity=IdentityConfig(verify=True, master_keys=Secret(f"k1={MASTER.hex()}")),
        alerter=dataclasses.replace(
            isolated_cfg.alerter, remediation_enabled=True, remediation_dry_run=False,
            remediation_executor="command", remediation_command="/bin/true {node}",
            confirm_seconds=0, max_fleet_share=1.0, max_job_share=1.0, fleet_nodes=10))
    ensure_topics(cfg)
    r = redis.Redis.from_url(cfg.redis_url)
    samples = _Samples()
    alerter = Alerter(cfg, None, LiveState(r, cfg.redis.key_prefix), {}, samples)
    assert alerter.remediator is not None
    now = time.time()
    det = dict(health("sw1"), started_at=now, detected_at=now)
    alerter.state.apply(det)  # type: ignore[arg-type]
    alerter.remediator.consider(det, now=now)  # type: ignore[arg-type]
    alerter.remediator.tick(now=now + 1)
    repairs = RepairLog(r, cfg.redis.key_prefix)
    assert repairs.state("sw1") == "awaiting_repair"

    def sample(uuid: str, signer: Signer | None) -> _Record:
        value = json.dumps({"schema": "vigil.sample/1", "ts": now, "job": "job-1",
                            "node": "sw1", "gpus": {}, "host": {}, "nics": {},
                            "meta": {"gpu_uuids": {"3": uuid}}}).encode()
        return _Record(value, signer.headers(value) if signer else None)

    own = Signer("k1", node_key(MASTER, "sw1"))
    samples.batches = [[sample("GPU-aaa", own)],  # the baseline
                       [sample("GPU-bbb", Signer("k1", node_key(MASTER, "sw2"))),
                        sample("GPU-bbb", None)]]  # another node's key; no proof
    alerter._watch_uuids()
    alerter._watch_uuids()
    assert repairs.state("sw1") == "awaiting_repair"
    samples.batches = [[sample("GPU-bbb", own)]]
    alerter._watch_uuids()
    assert repairs.state("sw1") == "verifying"
    assert repairs.record("sw1")["why"] == "GPU UUID changed on GPU 3: a replaced GPU"
