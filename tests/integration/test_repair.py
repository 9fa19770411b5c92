"""The repair lifecycle's rules against a real Redis, with an executor that records
what it was asked (the real Slurm loop is in test_repair_slurm.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import redis

from tests.integration.test_remediation import health
from vigil_gpu_monitor.alerting.executors import CheckResult, Hold
from vigil_gpu_monitor.alerting.remediation import Remediator, audit_log, plan
from vigil_gpu_monitor.alerting.repair import RepairLog, TransitionRefused, repair_done
from vigil_gpu_monitor.alerting.router import Route, Router
from vigil_gpu_monitor.alerting.silences import SilenceStore
from vigil_gpu_monitor.contracts.codec import validate_detection
from vigil_gpu_monitor.contracts.config import AlerterConfig, Config
from vigil_gpu_monitor.contracts.messages import Action, Detection

pytestmark = pytest.mark.integration
T0 = 1_900_000_000.0


class Recorder:
    """A returning executor: the node is out while Vigil's drain holds it."""

    name = "recorder"

    def __init__(self, check_rc: int = 0) -> None:
        self.calls: list[str] = []
        self.held: dict[str, Hold] = {}
        self.check_rc = check_rc

    def execute(self, action: Action) -> str:
        self.calls.append(f"{action['action']} {action['node']}")
        self.held[action["node"]] = Hold(True, True, f"vigil {action['action']}")
        return "drained"

    def holder(self, node: str) -> Hold:
        return self.held.get(node, Hold(False, False))

    def release(self, node: str) -> str:
        self.calls.append(f"return {node}")
        self.held.pop(node, None)
        return "resumed"

    def check(self, argv: list[str], timeout: float) -> CheckResult:
        self.calls.append("check " + " ".join(argv))
        return CheckResult(self.check_rc, "ok" if self.check_rc == 0 else "bad")


def setup(cfg: Config, open_now: list[Detection] | None = None, check_rc: int = 0,
          **overrides: Any) -> tuple[Remediator, Recorder, RepairLog, list[Detection]]:
    settings: dict[str, Any] = {
        "remediation_enabled": True, "remediation_dry_run": False, "confirm_seconds": 0,
        "repair_evidence_seconds": 600, "max_fleet_share": 1.0, "fleet_nodes": 10,
        "max_job_share": 1.0, "repair_check_command": "diag {node} {gpu}", **overrides}
    acfg = dataclasses.replace(AlerterConfig(), **settings)
    ex, people = Recorder(check_rc), []
    r = redis.Redis.from_url(cfg.redis_url)
    rem = Remediator(acfg, r, cfg.redis.key_prefix, ex, lambda d: True, None, people.append,
                     lambda node: [d for d in open_now or [] if d["node"] == node])
    return rem, ex, RepairLog(r, cfg.redis.key_prefix), people


def take_out(rem: Remediator, det: Detection, at: float = T0) -> None:
    rem.consider(det, now=at)
    rem.tick(now=at + 1)


def test_reset_verifies_at_once_and_returns_after_the_window(isolated_cfg: Config) -> None:
    rem, ex, repairs, _ = setup(isolated_cfg)
    take_out(rem, health("n1", xid=94))  # reset_gpu
    assert repairs.state("n1") == "verifying"
    rem.tick(now=T0 + 2)  # the check runs
    assert ex.calls == ["reset_gpu n1", "check diag n1 3"]
    rem.tick(now=T0 + 300)
    assert repairs.state("n1") == "verifying"  # the evidence window is not over
    rem.tick(now=T0 + 603)
    assert repairs.state("n1") == "in_service" and ex.calls[-1] == "return n1"
    stats = repairs.stats()
    assert stats["count"] == 1 and "le:600" not in stats and stats["le:1800"] == 1
    assert stats["sum"] == pytest.approx(602)


def test_a_health_detection_in_the_window_holds_the_node_out(isolated_cfg: Config) -> None:
    rem, ex, repairs, people = setup(isolated_cfg)
    take_out(rem, health("n1", xid=94))
    rem.tick(now=T0 + 2)
    link = dict(health("n1", ident="link-1"), kind="link_health", summary="NIC mlx5_0 down")
    rem.consider(link, now=T0 + 100)  # type: ignore[arg-type]
    rem.tick(now=T0 + 700)
    record = repairs.record("n1")
    assert record["state"] == "held_out" and "NIC mlx5_0 down" in record["why"]
    assert "return n1" not in ex.calls
    [told] = people
    assert told["severity"] == "critical" and "holds n1 out" in told["summary"]
    validate_detection(told)


def test_an_incident_still_open_at_the_end_holds_the_node_out(isolated_cfg: Config) -> None:
    still = health("n1")
    rem, ex, repairs, _ = setup(isolated_cfg, open_now=[still])
    take_out(rem, health("n1", xid=94))
    rem.tick(now=T0 + 2)
    rem.tick(now=T0 + 700)
    assert repairs.record("n1")["why"].startswith("gpu_health still open")


def test_a_failed_check_holds_the_node_out(isolated_cfg: Config) -> None:
    rem, ex, repairs, _ = setup(isolated_cfg, check_rc=3)
    take_out(rem, health("n1", xid=94))
    rem.tick(now=T0 + 2)
    record = repairs.record("n1")
    assert record["state"] == "held_out" and record["why"].startswith("check failed (exit 3)")
    assert [a["decision"] for a in audit_log(rem.r, isolated_cfg.redis.key_prefix)
            if a["action"] == "verify_check"] == ["failed"]


def test_a_new_gpu_uuid_starts_verification(isolated_cfg: Config) -> None:
    rem, ex, repairs, _ = setup(isolated_cfg)
    take_out(rem, health("n1"))  # drain_and_replace: waits for the swap
    assert rem.repair is not None and repairs.state("n1") == "awaiting_repair"
    assert not rem.repair.observe_uuids("n1", {"3": "GPU-aaa"}, now=T0 + 10)  # baseline
    assert not rem.repair.observe_uuids("n1", {"3": "GPU-aaa"}, now=T0 + 20)
    assert rem.repair.observe_uuids("n1", {"3": "GPU-bbb"}, now=T0 + 30)
    assert repairs.record("n1")["why"] == "GPU UUID changed on GPU 3: a replaced GPU"
    assert not rem.repair.observe_uuids("n2", {"0": "GPU-x"})  # not out: ignored


def test_a_cordoned_straggler_is_verified_after_its_wait(isolated_cfg: Config) -> None:
    rem, ex, repairs, _ = setup(isolated_cfg, straggler_cordon_after_seconds=0,
                                repair_straggler_wait_seconds=1800)
    straggler = dict(health("n1", ident="s-1"), kind="straggler", severity="warning")
    take_out(rem, straggler)  # type: ignore[arg-type]
    assert repairs.state("n1") == "awaiting_repair"
    rem.tick(now=T0 + 1000)
    assert repairs.state("n1") == "awaiting_repair"
    rem.tick(now=T0 + 1802)
    assert repairs.state("n1") == "verifying"


def test_the_same_fault_in_probation_holds_out_and_escalates(isolated_cfg: Config) -> None:
    rem, ex, repairs, people = setup(isolated_cfg, repair_evidence_seconds=0)
    take_out(rem, health("n1", xid=94))
    rem.tick(now=T0 + 2)
    rem.tick(now=T0 + 3)
    assert repairs.state("n1") == "in_service"
    other = dict(health("n1", ident="other"), evidence={"action": "investigate"})
    rem.consider(other, now=T0 + 100)  # type: ignore[arg-type]
    assert repairs.state("n1") == "in_service"  # a different fault: not probation's
    rem.consider(health("n1", xid=94, ident="again"), now=T0 + 200)
    record = repairs.record("n1")
    assert record["state"] == "held_out" and "came back during probation" in record["why"]
    assert ex.calls[-1] == "hold_out n1" and len(people) == 1
    assert rem.tick(now=T0 + 300) == []  # a node Vigil holds gets no new action


def test_a_node_someone_else_holds_is_neither_taken_nor_returned(isolated_cfg: Config) -> None:
    rem, ex, repairs, _ = setup(isolated_cfg, repair_evidence_seconds=0)
    ex.held["n2"] = Hold(True, False, "bad DIMM (ops)")
    take_out(rem, health("n2"))
    assert ex.calls == [] and repairs.state("n2") == "in_service"
    take_out(rem, health("n1", xid=94))
    ex.held["n1"] = Hold(True, False, "firmware (ops)")  # a person took it over
    rem.tick(now=T0 + 2)
    rem.tick(now=T0 + 3)
    assert repairs.state("n1") == "held_out" and "return n1" not in ex.calls
    assert "firmware (ops)" in repairs.record("n1")["why"]


def test_the_return_budget_defers_and_audits_once(isolated_cfg: Config) -> None:
    rem, ex, repairs, _ = setup(isolated_cfg, repair_evidence_seconds=0,
                                repair_max_returns_per_hour=1)
    for node in ("n1", "n2"):
        take_out(rem, health(node, xid=94))
    for k in range(4):
        rem.tick(now=T0 + 2 + k)
    assert repairs.state("n1") == "in_service" and repairs.state("n2") == "verifying"
    deferred = [a for a in audit_log(rem.r, isolated_cfg.redis.key_prefix)
                if a["action"] == "return" and a["decision"] == "skipped"]
    assert len(deferred) == 1 and deferred[0]["why"] == "1 returns in the last hour"
    rem.tick(now=T0 + 3700)
    assert repairs.state("n2") == "in_service"


def test_repair_done_only_for_a_node_vigil_holds(isolated_cfg: Config) -> None:
    rem, ex, repairs, _ = setup(isolated_cfg)
    with pytest.raises(TransitionRefused, match="n9 is in_service"):
        repair_done(repairs, "n9", "ana", "")
    take_out(rem, health("n1"))
    repair_done(repairs, "n1", "ana", "swapped", now=T0 + 5)
    assert repairs.record("n1")["who"] == "ana"


def test_load_imbalance_and_slowdown_are_never_acted_on_or_paged(isolated_cfg: Config) -> None:
    cfg = AlerterConfig()
    imbalance = dict(health("n1"), kind="load_imbalance", severity="info")
    slowdown = dict(health("n1"), kind="slowdown", node=None, gpu=None)
    assert plan(imbalance, cfg) is None and plan(slowdown, cfg) is None  # type: ignore[arg-type]
    store = SilenceStore(redis.Redis.from_url(isolated_cfg.redis_url),
                         isolated_cfg.redis.key_prefix)
    router = Router({"owner": Route.parse("kinds=load_imbalance,slowdown"),
                     "pager": Route(pager=True)}, store, page_after_seconds=0)
    sent = router.handle(imbalance, now=0) + router.tick(now=10)  # type: ignore[arg-type]
    assert [c for c, _ in sent] == ["owner"]


def test_metrics_count_nodes_out_and_repair_time(isolated_cfg: Config) -> None:
    from types import SimpleNamespace

    from vigil_gpu_monitor.alerting.metrics import repair_metrics

    rem, ex, repairs, _ = setup(isolated_cfg, repair_evidence_seconds=0)
    past = 1_700_000_000.0  # before the scrape: the node has been out since then
    take_out(rem, health("n1", xid=94), at=past)  # returned after 2 s
    rem.tick(now=past + 2)
    rem.tick(now=past + 3)
    take_out(rem, health("n2"), at=past)  # awaiting a swap
    samples = {(m.name, s.name, tuple(sorted(s.labels.items()))): s.value
               for m in repair_metrics(SimpleNamespace(remediator=rem))  # type: ignore[arg-type]
               for s in m.samples}
    assert samples["vigil_nodes_out", "vigil_nodes_out", (("state", "awaiting_repair"),)] == 1
    assert samples["vigil_nodes_out", "vigil_nodes_out", (("state", "verifying"),)] == 0
    assert samples["vigil_node_repair_seconds", "vigil_node_repair_seconds_count", ()] == 1
    assert samples["vigil_gpu_hours_held_out", "vigil_gpu_hours_held_out", ()] > 0
