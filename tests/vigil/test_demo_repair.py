"""The demo's repair act without Slurm: its node choice, its configuration (remediation
executed by Slurm, the evidence window above the health hold), and its samples
replayed offline: the XID fires as a fault Vigil drains a node for, then resolves,
and nothing else fires; and where Slurm cannot start, the act says so and is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil_gpu_monitor.alerting.remediation import plan
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.vigil.evaluation import demo_repair
from vigil_gpu_monitor.vigil.evaluation.demo_repair import (
    GPU,
    HISTORY,
    SAMPLES,
    act_cluster,
    act_env,
    act_simulator,
    pick_node,
)
from vigil_gpu_monitor.vigil.ops.localstack import StackError

START = 1_860_000_000.0
NODES = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


def test_pick_node_takes_an_idle_node_and_never_a_drained_one() -> None:
    assert pick_node(dict.fromkeys(NODES, "idle")) == "gpu-02"
    assert pick_node({"gpu-01": "idle", "gpu-02": "drained", "gpu-03": "idle*"}) == "gpu-01"
    assert pick_node({"gpu-01": "drained", "gpu-02": "down*"}) is None


def test_act_env_enables_real_remediation_on_its_own_topics() -> None:
    base = {"VIGIL_KAFKA_TOPIC_PREFIX": "demo-1.", "VIGIL_ALERTER_REMEDIATION_DRY_RUN": "true"}
    cfg = load(env=act_env(base, "1", "/slurm.conf", len(NODES)))
    a = cfg.alerter
    assert a.remediation_enabled and not a.remediation_dry_run
    assert a.remediation_executor == "slurm" and a.slurm_conf == "/slurm.conf"
    assert cfg.kafka.topic_prefix != "demo-1." and cfg.redis.key_prefix.endswith("-repair")
    assert a.repair_evidence_seconds > cfg.detect.health_hold_seconds
    assert "{node}" in a.repair_check_command


def test_act_samples_fire_one_drainable_xid_that_resolves() -> None:
    cfg = load(env=act_env({}, "1", "", len(NODES)))
    runner = ReplayRunner(cfg.detect)
    found = [d for s in act_simulator(act_cluster(NODES, "gpu-02", START), START)
             .samples(HISTORY + SAMPLES) for d in runner.feed(s)]
    firing = [d for d in found if d["state"] == "firing"]
    assert [(d["kind"], d["node"], d["gpu"]) for d in firing] == [("gpu_health", "gpu-02", GPU)]
    assert plan(firing[0], cfg.alerter) == ("drain_and_replace", cfg.alerter.confirm_seconds)
    [resolved] = [d for d in found if d["state"] == "resolved"]
    assert resolved["id"] == firing[0]["id"]
    assert resolved["detected_at"] - firing[0]["detected_at"] < 60


def test_without_slurm_the_act_says_so_and_is_skipped(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    def no_slurm(cfg: Config) -> None:
        raise StackError("slurmctld not found: install it (apt-get install slurmctld)")

    stopped: list[Config] = []
    monkeypatch.setattr(demo_repair, "start_slurm", no_slurm)
    monkeypatch.setattr(demo_repair, "stop_slurm", stopped.append)
    env = {"VIGIL_LOCAL_DATA_DIR": str(tmp_path)}
    assert demo_repair.run_act(env, "1", str(tmp_path)) is None
    out = capsys.readouterr().out
    assert "SKIPPED: Slurm cannot start on this machine" in out
    assert "apt-get install slurmctld" in out and "back in service" not in out
    assert len(stopped) == 1  # whatever part of it had started is stopped again
