"""The repair loop end to end against a real Slurm controller (munged, slurmctld and a
slurmd per node, started by ``vigil.ops.slurmstack``), real Kafka and real Redis:
a detection drains a node, the repair is reported, the check passes and ``sinfo``
shows the node back; or it stays drained and ``held_out`` with the reason."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer

from vigil_gpu_monitor.alerting.remediation import audit_log
from vigil_gpu_monitor.alerting.repair import RepairLog
from vigil_gpu_monitor.alerting.service import Alerter
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_detection
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.contracts.errors import VigilError
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics
from vigil_gpu_monitor.vigil.ops.slurmstack import (
    node_names,
    sinfo_states,
    slurm_binary,
    slurm_conf_path,
    slurm_services,
    start_slurm,
    stop_slurm,
)

pytestmark = pytest.mark.integration
VIGIL = [sys.executable, "-m", "vigil_gpu_monitor"]


@pytest.fixture(scope="session")
def slurm() -> Iterator[Config]:
    """The local Slurm: the one `vigil up` started (local.slurm), else started here and
    stopped after the session. Skips only where Slurm cannot be installed (not root,
    no apt-get); where it could, a failed install fails (a skip there once hid two
    tests whose install lost a race for dpkg's lock)."""
    cfg = load()
    cfg = dataclasses.replace(cfg, local=dataclasses.replace(cfg.local, slurm=True))
    try:
        for binary in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo"):
            slurm_binary(binary)
    except VigilError as exc:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            pytest.fail(f"Slurm could not be installed: {exc}")
        pytest.skip(f"Slurm cannot be installed here: {exc}")
    running = all(svc.pid() is not None for svc in slurm_services(cfg).values())
    if not running:
        start_slurm(cfg)
    yield cfg
    if not running:
        stop_slurm(cfg)


def scontrol(cfg: Config, *args: str) -> str:
    done = subprocess.run([slurm_binary("scontrol"), *args], capture_output=True, text=True,
                          env=dict(os.environ, SLURM_CONF=str(slurm_conf_path(cfg))),
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def idle_nodes(slurm: Config) -> Config:
    """Every local node idle before the test (a previous one may have drained some)."""
    for node, state in sinfo_states(slurm).items():
        if "drain" in state:
            scontrol(slurm, "update", f"NodeName={node}", "State=RESUME")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(
            s != "idle" for s in sinfo_states(slurm).values()):
        time.sleep(0.5)
    assert set(sinfo_states(slurm).values()) == {"idle"}
    return slurm


def settled(cfg: Config, node: str, timeout: float = 30) -> str:
    """The node's sinfo state once it has no ``*`` (a resumed node shows ``idle*`` until
    its slurmd answers the controller's next ping)."""
    deadline = time.monotonic() + timeout
    state = sinfo_states(cfg)[node]
    while state.endswith("*") and time.monotonic() < deadline:
        time.sleep(0.5)
        state = sinfo_states(cfg)[node]
    return state


def check_script(tmp_path: Path, rc: int) -> Path:
    script = tmp_path / f"check-{rc}"
    script.write_text(f'#!/bin/sh\necho "diag of $1: {"PASS" if rc == 0 else "FAIL"}"\n'
                      f"exit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def repair_env(isolated_env: dict[str, str], slurm: Config, tmp_path: Path, check_rc: int = 0,
               **extra: str) -> dict[str, str]:
    env = dict(isolated_env, VIGIL_ALERTER_REMEDIATION_ENABLED="true",
               VIGIL_ALERTER_REMEDIATION_DRY_RUN="false",
               VIGIL_ALERTER_REMEDIATION_EXECUTOR="slurm",
               VIGIL_ALERTER_SLURM_CONF=str(slurm_conf_path(slurm)),
               VIGIL_ALERTER_CONFIRM_SECONDS="0", VIGIL_ALERTER_REPAIR_EVIDENCE_SECONDS="1",
               VIGIL_ALERTER_REPAIR_CHECK_COMMAND=f"{check_script(tmp_path, check_rc)} {{node}}",
               VIGIL_ALERTER_FLEET_NODES=str(len(node_names(slurm))),
               VIGIL_ALERTER_MAX_FLEET_SHARE="1.0", VIGIL_ALERTER_MAX_JOB_SHARE="1.0",
               VIGIL_ALERTER_REPAIR_WATCH_SAMPLES="false")
    env.update({f"VIGIL_ALERTER_{k.upper()}": v for k, v in extra.items()})
    return env


def detection(node: str, state: str = "firing", at: float | None = None) -> dict[str, Any]:
    at = time.time() if at is None else at
    return {"schema": "vigil.detection/1", "id": f"gpu_health-{node}-xid79", "kind": "gpu_health",
            "state": state, "severity": "critical", "job": "train-1", "node": node, "gpu": "3",
            "started_at": at, "detected_at": at, "metrics": ["xid"], "score": 10.0,
            "summary": f"XID 79 on {node} GPU 3: fell off the bus",
            "evidence": {"xid": 79, "action": "replace", "metric": "xid", "job_nodes": 4,
                         "job_gpus": 32}}


def publish(cfg: Config, *dets: dict[str, Any]) -> None:
    ensure_topics(cfg)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    for d in dets:
        producer.send(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                      key=d["job"].encode(), value=encode_detection(d))
    producer.flush()
    producer.close()


def alerter(cfg: Config) -> Alerter:
    consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap, group_id=cfg.alerter.group_id,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    return Alerter(cfg, consumer, LiveState(redis.Redis.from_url(cfg.redis_url),
                                            cfg.redis.key_prefix))


def run_until(a: Alerter, done: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        a.poll_once(timeout_ms=300)
    assert done(), "timed out"


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*VIGIL, *args], env=env, capture_output=True, text=True, timeout=60)


def test_drained_repaired_checked_and_back_in_service(isolated_env: dict[str, str],
                                                      idle_nodes: Config,
                                                      tmp_path: Path) -> None:
    env = repair_env(isolated_env, idle_nodes, tmp_path)
    cfg = load(env=env)
    repairs = RepairLog(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    a = alerter(cfg)
    try:
        publish(cfg, detection("gpu-01"))
        run_until(a, lambda: repairs.state("gpu-01") == "awaiting_repair")
        assert sinfo_states(idle_nodes)["gpu-01"] == "drained"
        assert "vigil drain_and_replace gpu 3" in scontrol(idle_nodes, "show", "node", "gpu-01")
        listed = cli(env, "nodes")
        assert "gpu-01" in listed.stdout and "awaiting_repair" in listed.stdout, listed
        publish(cfg, detection("gpu-01", "resolved"))  # the detector lets go of the XID
        done = cli(env, "repair", "done", "gpu-01", "--note", "swapped GPU 3", "--by", "ana")
        assert done.returncode == 0, done.stderr
        run_until(a, lambda: repairs.state("gpu-01") == "in_service")
    finally:
        a.close()
        a.consumer.close()
    assert settled(idle_nodes, "gpu-01") == "idle"
    steps = [(s["to"], s["who"]) for s in reversed(repairs.history("gpu-01"))]
    assert steps == [("out", "vigil"), ("awaiting_repair", "vigil"), ("verifying", "ana"),
                     ("in_service", "vigil")]
    record = repairs.record("gpu-01")
    assert record["check_rc"] == "0" and "diag of gpu-01: PASS" in record["check_output"]
    assert float(record["probation_until"]) > time.time() + 3600
    story = [(x["action"], x["decision"]) for x in reversed(audit_log(repairs.r,
                                                                      cfg.redis.key_prefix))]
    assert story == [("drain_and_replace", "executed"), ("verify_check", "executed"),
                     ("return", "executed")]
    shown = cli(env, "actions", "--node", "gpu-01").stdout
    assert "repair reported by ana: swapped GPU 3" in shown and "in_service" in shown
    assert cli(env, "nodes").stdout.strip() == "no nodes out of service"


def test_a_failed_check_leaves_the_node_drained_and_held_out(isolated_env: dict[str, str],
                                                             idle_nodes: Config,
                                                             tmp_path: Path) -> None:
    cfg = load(env=repair_env(isolated_env, idle_nodes, tmp_path, check_rc=1))
    repairs = RepairLog(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    a = alerter(cfg)
    try:
        publish(cfg, detection("gpu-02"))
        run_until(a, lambda: repairs.state("gpu-02") == "awaiting_repair")
        repairs_done = cli(repair_env(isolated_env, idle_nodes, tmp_path, 1), "repair", "done",
                           "gpu-02")
        assert repairs_done.returncode == 0, repairs_done.stderr
        run_until(a, lambda: repairs.state("gpu-02") == "held_out")
    finally:
        a.close()
        a.consumer.close()
    assert sinfo_states(idle_nodes)["gpu-02"] == "drained"
    record = repairs.record("gpu-02")
    assert record["why"].startswith("check failed (exit 1)") and "FAIL" in record["why"]
    assert record["check_rc"] == "1"
    assert "gpu-02" in RepairLog(repairs.r, cfg.redis.key_prefix).out_nodes()


def test_a_node_a_person_drained_is_never_resumed(isolated_env: dict[str, str],
                                                  idle_nodes: Config, tmp_path: Path) -> None:
    env = repair_env(isolated_env, idle_nodes, tmp_path)
    cfg = load(env=env)
    repairs = RepairLog(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    scontrol(idle_nodes, "update", "NodeName=gpu-03", "State=DRAIN", "Reason=bad DIMM (ops)")
    a = alerter(cfg)
    try:
        # drained by a person before Vigil saw a fault: Vigil does not take it over
        publish(cfg, detection("gpu-03"))
        run_until(a, lambda: bool(audit_log(repairs.r, cfg.redis.key_prefix)))
        [skipped] = audit_log(repairs.r, cfg.redis.key_prefix)
        assert skipped["decision"] == "skipped" and "bad DIMM (ops)" in skipped["why"]
        assert repairs.state("gpu-03") == "in_service"  # no lifecycle: not Vigil's
        # Vigil drains gpu-04; a person re-drains it with their own reason mid-repair
        publish(cfg, detection("gpu-04"))
        run_until(a, lambda: repairs.state("gpu-04") == "awaiting_repair")
        scontrol(idle_nodes, "update", "NodeName=gpu-04", "State=DRAIN",
                 "Reason=firmware update (ops)")
        publish(cfg, detection("gpu-04", "resolved"))
        assert cli(env, "repair", "done", "gpu-04").returncode == 0
        run_until(a, lambda: repairs.state("gpu-04") == "held_out")
    finally:
        a.close()
        a.consumer.close()
    states = sinfo_states(idle_nodes)
    assert states["gpu-03"] == "drained" and states["gpu-04"] == "drained"
    assert "bad DIMM (ops)" in scontrol(idle_nodes, "show", "node", "gpu-03")
    assert "firmware update (ops)" in scontrol(idle_nodes, "show", "node", "gpu-04")
    assert "held out by someone else (firmware update (ops))" in repairs.record("gpu-04")["why"]


@pytest.mark.parametrize("rail", ["budget", "share"])
def test_a_rail_that_says_no_leaves_everything_as_it_was(rail: str,
                                                         isolated_env: dict[str, str],
                                                         idle_nodes: Config,
                                                         tmp_path: Path) -> None:
    extra = {"max_actions_per_hour": "0"} if rail == "budget" else {"max_fleet_share": "0.25"}
    cfg = load(env=repair_env(isolated_env, idle_nodes, tmp_path, **extra))
    repairs = RepairLog(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    a = alerter(cfg)
    try:
        if rail == "share":  # one node of four may be out: gpu-01 takes the share
            publish(cfg, detection("gpu-01"))
            run_until(a, lambda: repairs.state("gpu-01") == "awaiting_repair")
        publish(cfg, detection("gpu-02"))
        run_until(a, lambda: any(x["node"] == "gpu-02" for x in audit_log(
            repairs.r, cfg.redis.key_prefix)))
    finally:
        a.close()
        a.consumer.close()
    [decision] = [x for x in audit_log(repairs.r, cfg.redis.key_prefix) if x["node"] == "gpu-02"]
    assert decision["decision"] == "skipped"
    assert decision["why"].startswith("0 actions in the last hour" if rail == "budget"
                                      else "would exceed 25% of the fleet")
    assert sinfo_states(idle_nodes)["gpu-02"] == "idle"
    assert repairs.state("gpu-02") == "in_service" and not repairs.history("gpu-02")


def test_an_alerter_restart_mid_repair_loses_nothing(isolated_env: dict[str, str],
                                                     idle_nodes: Config,
                                                     tmp_path: Path) -> None:
    env = repair_env(isolated_env, idle_nodes, tmp_path, repair_evidence_seconds="4")
    cfg = load(env=env)
    repairs = RepairLog(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    first = alerter(cfg)
    try:
        publish(cfg, detection("gpu-01"))
        run_until(first, lambda: repairs.state("gpu-01") == "awaiting_repair")
        publish(cfg, detection("gpu-01", "resolved"))
        assert cli(env, "repair", "done", "gpu-01").returncode == 0
        run_until(first, lambda: "evidence_from" in repairs.record("gpu-01"))
    finally:
        first.close()
        first.consumer.close()  # mid evidence window: the process is gone
    assert repairs.state("gpu-01") == "verifying"
    second = alerter(cfg)
    try:
        run_until(second, lambda: repairs.state("gpu-01") == "in_service")
    finally:
        second.close()
        second.consumer.close()
    assert settled(idle_nodes, "gpu-01") == "idle"
    checks = [x for x in audit_log(repairs.r, cfg.redis.key_prefix)
              if x["action"] == "verify_check"]
    assert len(checks) == 1  # the check ran once; the second alerter only finished the wait
    drains = [x for x in audit_log(repairs.r, cfg.redis.key_prefix)
              if x["action"] == "drain_and_replace"]
    assert len(drains) == 1  # the replayed detection did not drain it again


def test_a_replaced_gpu_seen_in_samples_starts_verification(isolated_env: dict[str, str],
                                                            idle_nodes: Config,
                                                            tmp_path: Path) -> None:
    cfg = load(env=repair_env(isolated_env, idle_nodes, tmp_path))
    repairs = RepairLog(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    samples = KafkaConsumer(topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                            bootstrap_servers=cfg.kafka_bootstrap, group_id=None,
                            auto_offset_reset="earliest", enable_auto_commit=False)
    a = alerter(cfg)
    a.samples = samples
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")

    def sample(node: str, uuid: str) -> None:
        body = {"schema": "vigil.sample/1", "ts": time.time(), "job": "train-1", "node": node,
                "gpus": {}, "host": {}, "nics": {}, "meta": {"gpu_uuids": {"3": uuid}}}
        producer.send(topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
                      key=b"train-1", value=json.dumps(body).encode())
        producer.flush()

    try:
        publish(cfg, detection("gpu-02"))
        run_until(a, lambda: repairs.state("gpu-02") == "awaiting_repair")
        sample("gpu-02", "GPU-old")
        run_until(a, lambda: "uuids" in repairs.record("gpu-02"))
        sample("gpu-01", "GPU-unrelated")
        sample("gpu-02", "GPU-new")
        run_until(a, lambda: repairs.state("gpu-02") != "awaiting_repair")
    finally:
        producer.close()
        a.close()
        a.consumer.close()
        samples.close()
    [change] = [s for s in repairs.history("gpu-02") if s["to"] == "verifying"]
    assert change["why"] == "GPU UUID changed on GPU 3: a replaced GPU" and change["who"] == "vigil"
