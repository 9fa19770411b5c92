"""Remediation rails against a real Redis; executors run real processes."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer

from vigil_gpu_monitor.alerting.executors import CommandExecutor, SlurmExecutor
from vigil_gpu_monitor.alerting.remediation import Remediator, audit_log, plan
from vigil_gpu_monitor.alerting.repair import RepairLog
from vigil_gpu_monitor.alerting.service import build_remediator
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import validate_detection
from vigil_gpu_monitor.contracts.config import AlerterConfig, Config, load
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

pytestmark = pytest.mark.integration
T0 = 1_900_000_000.0


def health(node: str, job: str = "job-1", xid: int = 79, ident: str | None = None,
           job_nodes: int = 20) -> dict[str, Any]:
    return {"schema": "vigil.detection/1", "id": ident or f"gpu_health-{node}",
            "kind": "gpu_health", "state": "firing", "severity": "critical", "job": job,
            "node": node, "gpu": "3", "started_at": T0, "detected_at": T0,
            "metrics": ["xid"], "score": 10.0, "summary": f"XID {xid} on {node}",
            "evidence": {"xid": xid, "action": {79: "replace", 94: "reset", 13: "application"}
                         .get(xid, "investigate"), "metric": "xid", "job_nodes": job_nodes}}


def recorder_script(tmp_path: Path, name: str = "record") -> tuple[Path, Path]:
    out = tmp_path / f"{name}.calls"
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\necho "$@" >> "{out}"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, out


def remediator(cfg: Config, tmp_path: Path, escalated: list[dict[str, Any]] | None = None,
               **overrides: Any) -> tuple[Remediator, Path, list[dict[str, Any]]]:
    script, calls = recorder_script(tmp_path)
    acfg = dataclasses.replace(AlerterConfig(), remediation_enabled=True, confirm_seconds=60,
                               **overrides)
    published: list[dict[str, Any]] = []
    rem = Remediator(acfg, redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix,
                     CommandExecutor(f"{script} {{action}} {{node}} {{gpu}}"),
                     lambda det: True, published.append,
                     escalated.append if escalated is not None else None)
    return rem, calls, published


def test_policy() -> None:
    cfg = AlerterConfig()
    assert plan(health("n1", xid=79), cfg) == ("drain_and_replace", cfg.confirm_seconds)
    assert plan(health("n1", xid=94), cfg) == ("reset_gpu", cfg.confirm_seconds)
    assert plan(health("n1", xid=13), cfg) is None  # the application's fault
    ecc = health("n1")
    ecc["evidence"] = {"metric": "ecc_dbe", "action": "replace"}
    assert plan(ecc, cfg)[0] == "drain_and_replace"  # type: ignore[index]
    straggler = dict(health("n1"), kind="straggler", evidence={})
    assert plan(straggler, cfg) == ("cordon", cfg.straggler_cordon_after_seconds)
    assert plan(dict(health("n1"), state="resolved"), cfg) is None


def test_dry_run_is_the_default_and_executes_nothing(isolated_cfg: Config,
                                                     tmp_path: Path) -> None:
    rem, calls, published = remediator(isolated_cfg, tmp_path)
    assert rem.cfg.remediation_dry_run is True
    rem.consider(health("n1"), now=T0)
    assert rem.tick(now=T0 + 30) == []  # still in its confirmation window
    [record] = rem.tick(now=T0 + 61)
    assert record["decision"] == "dry_run" and not calls.exists()
    assert published == [record]
    assert audit_log(rem.r, isolated_cfg.redis.key_prefix)[0]["id"] == record["id"]


def test_resolved_during_confirmation_is_not_acted_on(isolated_cfg: Config,
                                                      tmp_path: Path) -> None:
    rem, calls, _ = remediator(isolated_cfg, tmp_path, remediation_dry_run=False)
    rem.consider(health("n1"), now=T0)
    rem.consider(dict(health("n1"), state="resolved"), now=T0 + 10)
    assert rem.tick(now=T0 + 100) == [] and not calls.exists()
    assert audit_log(rem.r, isolated_cfg.redis.key_prefix)[0]["why"].startswith(
        "incident resolved")


def test_execute_then_cooldown_lock_and_opt_out(isolated_cfg: Config, tmp_path: Path) -> None:
    rem, calls, _ = remediator(isolated_cfg, tmp_path, remediation_dry_run=False,
                               opt_out="n-keep*,job-vip")
    rem.consider(health("n1"), now=T0)
    rem.consider(health("n1", ident="second-incident-same-node"), now=T0 + 1)
    rem.consider(health("n-keep-2"), now=T0)
    rem.consider(health("n5", job="job-vip"), now=T0)
    records = {r["incident"]: r for r in rem.tick(now=T0 + 100)}
    assert records["gpu_health-n1"]["decision"] == "executed"
    assert records["second-incident-same-node"]["why"] == "node is in its cooldown"
    assert records["gpu_health-n-keep-2"]["why"].startswith("node or job is on the opt-out")
    assert records["gpu_health-n5"]["why"].startswith("node or job is on the opt-out")
    assert calls.read_text().split("\n")[0] == "drain_and_replace n1 3"
    rem.r.set(f"{rem.base}:lock:n9", "someone-else", ex=60)
    rem.consider(health("n9"), now=T0 + 200)
    [locked] = rem.tick(now=T0 + 300)
    assert locked["why"] == "another action holds the node's lock"


def test_hourly_budget(isolated_cfg: Config, tmp_path: Path) -> None:
    rem, calls, _ = remediator(isolated_cfg, tmp_path, remediation_dry_run=False,
                               max_actions_per_hour=5, max_fleet_share=1.0, fleet_nodes=100,
                               max_job_share=1.0)
    for i in range(7):
        rem.consider(health(f"n{i}"), now=T0)
    decisions = [r["decision"] for r in rem.tick(now=T0 + 100)]
    assert decisions.count("executed") == 5 and decisions.count("skipped") == 2
    assert len(calls.read_text().splitlines()) == 5


def straggler(node: str, lost: float | None, ident: str) -> dict[str, Any]:
    slowdown = None if lost is None else lost / (160 - lost)
    return dict(health(node, ident=ident), kind="straggler", severity="warning",
                metrics=["sm_active"], summary=f"GPU 3 on {node} is out of step",
                evidence={"job_nodes": 20, "job_gpus": 160, "job_slowdown": slowdown,
                          "gpu_hours_lost_per_hour": lost, "cost_basis": "baseline"})


def test_cost_decides_which_node_is_cordoned_first(isolated_cfg: Config,
                                                   tmp_path: Path) -> None:
    rem, calls, _ = remediator(isolated_cfg, tmp_path, remediation_dry_run=False,
                               max_actions_per_hour=1, straggler_cordon_after_seconds=300)
    # the cheap one fired first; both are due at the same tick
    rem.consider(straggler("cheap", 0.8, "s-cheap"), now=T0)
    rem.consider(straggler("dear", 14.0, "s-dear"), now=T0 + 5)
    records = {r["node"]: r for r in rem.tick(now=T0 + 400)}
    assert records["dear"]["decision"] == "executed"
    assert records["cheap"]["decision"] == "skipped"
    assert records["cheap"]["why"] == "1 actions in the last hour"
    assert calls.read_text().split() == ["cordon", "dear", "3"]
    # the audit keeps the estimate each decision stood on
    audited = {r["node"]: r for r in audit_log(rem.r, isolated_cfg.redis.key_prefix)}
    assert audited["dear"]["gpu_hours_lost_per_hour"] == 14.0
    assert audited["dear"]["job_slowdown"] == pytest.approx(14.0 / 146)


def test_cordon_by_cost_threshold(isolated_cfg: Config, tmp_path: Path) -> None:
    rem, calls, _ = remediator(isolated_cfg, tmp_path, remediation_dry_run=False,
                               max_actions_per_hour=10, max_fleet_share=1.0, fleet_nodes=10,
                               max_job_share=1.0, straggler_cordon_after_seconds=300,
                               straggler_cordon_gpu_hours_per_hour=4.0)
    rem.consider(straggler("small", 1.0, "s-small"), now=T0)
    rem.consider(straggler("unknown", None, "s-unknown"), now=T0)
    rem.consider(straggler("big", 6.0, "s-big"), now=T0)
    assert rem.tick(now=T0 + 200) == []  # not yet: the rule also wants the time
    records = {r["node"]: r for r in rem.tick(now=T0 + 301)}
    assert records["big"]["decision"] == "executed"
    assert records["small"]["why"].startswith("costs 1.0 GPU-hours per hour, under")
    assert records["unknown"]["why"].startswith("costs an unknown amount")
    assert calls.read_text().split() == ["cordon", "big", "3"]


def test_burst_of_100_faults_respects_the_fleet_and_job_shares(isolated_cfg: Config,
                                                               tmp_path: Path) -> None:
    rem, calls, published = remediator(
        isolated_cfg, tmp_path, remediation_dry_run=False, max_actions_per_hour=1000,
        fleet_nodes=400, max_fleet_share=0.05, max_job_share=0.25)
    for j in range(5):
        for n in range(20):
            rem.consider(health(f"j{j}-n{n}", job=f"job-{j}", job_nodes=20), now=T0)
    records = rem.tick(now=T0 + 100)
    executed = [r for r in records if r["decision"] == "executed"]
    assert len(records) == 100 and len(executed) == 20  # 5% of 400 nodes
    per_job = {j: sum(r["job"] == f"job-{j}" for r in executed) for j in range(5)}
    assert all(n <= 5 for n in per_job.values()), per_job  # 25% of each 20-node job
    assert len(calls.read_text().splitlines()) == 20 and len(published) == 100
    reasons = {r["why"].split(" of ")[0] for r in records if r["decision"] == "skipped"}
    assert reasons <= {"would exceed 25%", "would exceed 5%"}


def test_repeat_offender_goes_to_a_person(isolated_cfg: Config, tmp_path: Path) -> None:
    people: list[dict[str, Any]] = []
    rem, calls, _ = remediator(isolated_cfg, tmp_path, people, remediation_dry_run=False,
                               node_cooldown_seconds=60, repeat_offender_count=2)
    repairs = RepairLog(rem.r, isolated_cfg.redis.key_prefix)
    for k in range(3):
        rem.consider(health("n1", ident=f"inc-{k}"), now=T0 + k * 1000)
        rem.tick(now=T0 + k * 1000 + 100)
        if repairs.state("n1") != "in_service":  # returned, and past its probation
            repairs.move("n1", ("*",), "in_service", "returned", "test", T0 + k * 1000 + 200,
                         probation_until=None)
    decisions = [r["decision"] for r in reversed(audit_log(rem.r, isolated_cfg.redis.key_prefix))]
    assert decisions == ["executed", "executed", "escalated"]
    assert len(calls.read_text().splitlines()) == 2
    [page] = people
    assert page["severity"] == "critical" and page["id"] == "inc-2-escalated"
    assert page["summary"].startswith("Repeat offender n1")
    validate_detection(page)


def test_slurm_executor_drains_with_a_reason(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    script, calls = recorder_script(tmp_path, "scontrol")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    done = SlurmExecutor().execute({"action": "drain_and_replace", "node": "gpu-17",
                                    "gpu": "3", "incident": "gpu_health-abc"})
    assert calls.read_text().strip() == (
        "update NodeName=gpu-17 State=DRAIN Reason=vigil drain_and_replace gpu 3: "
        "incident gpu_health-abc")
    assert "scontrol" in done


def test_audit_reaches_the_actions_topic(isolated_env: dict[str, str], tmp_path: Path) -> None:
    script, _ = recorder_script(tmp_path)
    cfg = load(env=dict(isolated_env, VIGIL_ALERTER_REMEDIATION_ENABLED="true",
                        VIGIL_ALERTER_REMEDIATION_EXECUTOR="command",
                        VIGIL_ALERTER_REMEDIATION_COMMAND=f"{script} {{node}}",
                        VIGIL_ALERTER_CONFIRM_SECONDS="0"))
    ensure_topics(cfg)
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    rem = build_remediator(cfg, state)
    assert rem is not None
    det = health("n1")
    state.apply(det)
    rem.consider(det)
    [record] = rem.tick(now=time.time() + 1)
    assert record["decision"] == "dry_run"
    consumer = KafkaConsumer(topics.topic(topics.ACTIONS, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=5000)
    seen = [json.loads(r.value) for r in consumer]
    consumer.close()
    assert [s["id"] for s in seen] == [record["id"]]


class _LockThief:
    """An executor that runs past the node lock's expiry, during which another alerter
    takes the lock (what a slow drain and a second alerter replica do in production)."""

    name = "thief"

    def __init__(self, r: redis.Redis, key: str) -> None:
        self.r, self.key = r, key

    def execute(self, action: dict[str, Any]) -> str:
        self.r.delete(self.key)  # the lock expired while the drain ran
        assert self.r.set(self.key, "other-alerter-token", nx=True, ex=60)
        return "drained slowly"


def test_a_lock_taken_over_after_expiry_is_not_released_by_the_old_holder(
        isolated_cfg: Config) -> None:
    r = redis.Redis.from_url(isolated_cfg.redis_url)
    acfg = dataclasses.replace(AlerterConfig(), remediation_enabled=True, confirm_seconds=0,
                               remediation_dry_run=False)
    base = f"{isolated_cfg.redis.key_prefix}:remediation"
    rem = Remediator(acfg, r, isolated_cfg.redis.key_prefix, _LockThief(r, f"{base}:lock:n1"),
                     lambda det: True)
    rem.consider(health("n1"), now=T0)
    [record] = rem.tick(now=T0 + 1)
    assert record["decision"] == "executed"
    assert r.get(f"{base}:lock:n1") == b"other-alerter-token"  # the new holder keeps it
