"""A fuzz test of node names against the real ``slurmctld`` (issue #49): whatever name
an action carries, the Slurm executor drains the one node it names or nothing, and
no other node ever changes state. Before the fix, ``gpu-[01,03-04]`` drained three.

Also the remediation rails on the real stack: a host-list action is skipped with the
count it would have touched, before any rail or executor."""

from __future__ import annotations

import time

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.integration.test_repair_slurm import (  # noqa: F401 (fixtures)
    idle_nodes,
    scontrol,
    settled,
    slurm,
)
from vigil_gpu_monitor.alerting.executors import ExecutorError, SlurmExecutor
from vigil_gpu_monitor.alerting.remediation import Remediator, audit_log
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.contracts.messages import Action
from vigil_gpu_monitor.contracts.names import is_node_name
from vigil_gpu_monitor.vigil.ops.slurmstack import (
    node_names,
    sinfo_states,
    slurm_binary,
    slurm_conf_path,
)

pytestmark = pytest.mark.integration

name_parts = st.sampled_from(["gpu-0", "gpu-", "1", "2", "3", "4", "[", "]", ",", "-", ".",
                              "/", " ", "ALL", "all", "DEFAULT", "=", "\t", "x"])
names = st.one_of(st.lists(name_parts, min_size=1, max_size=8).map("".join),
                  st.text(max_size=20))


def action(node: str) -> Action:
    return {"id": "fuzz", "action": "drain_and_replace", "job": "train-1", "node": node,
            "gpu": "3", "incident": "fuzz", "summary": "", "job_nodes": 4,
            "planned_at": 0.0, "due_at": 0.0}


def resume(cfg: Config, node: str) -> None:
    scontrol(cfg, "update", f"NodeName={node}", "State=RESUME")
    settled(cfg, node)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(node=names)
@example(node="gpu-[01,03-04]")  # the issue's: three nodes drained by one action
@example(node="gpu-[01-04]")
@example(node="gpu-01,gpu-02")
@example(node="ALL")
@example(node="gpu-0[1-2]")
@example(node="gpu-01 gpu-02")
@example(node="gpu-02")  # one real node: drained, and only it
def test_no_node_but_the_named_one_changes_state(idle_nodes: Config,  # noqa: F811
                                                node: str) -> None:
    before = sinfo_states(idle_nodes)
    ex = SlurmExecutor(scontrol=slurm_binary("scontrol"),
                       slurm_conf=str(slurm_conf_path(idle_nodes)))
    try:
        ex.execute(action(node))
        acted = True
    except ExecutorError as exc:
        acted = False
        assert "refused node name" in str(exc) or is_node_name(node), exc
    after = sinfo_states(idle_nodes)
    changed = {n for n in before if after[n] != before[n]}
    try:
        if acted:
            assert is_node_name(node) and node in before
            assert changed == {node} and after[node].startswith("drain"), after
        else:
            assert changed == set(), (node, after)
    finally:
        for n in changed:
            resume(idle_nodes, n)


def test_the_rails_skip_a_host_list_before_any_executor(isolated_env: dict[str, str],
                                                        idle_nodes: Config,  # noqa: F811
                                                        ) -> None:
    cfg = load(env=dict(isolated_env, VIGIL_ALERTER_REMEDIATION_DRY_RUN="false",
                        VIGIL_ALERTER_MAX_FLEET_SHARE="1.0", VIGIL_ALERTER_MAX_JOB_SHARE="1.0",
                        VIGIL_ALERTER_FLEET_NODES=str(len(node_names(idle_nodes)))))
    r = redis.Redis.from_url(cfg.redis_url)
    ex = SlurmExecutor(scontrol=slurm_binary("scontrol"),
                       slurm_conf=str(slurm_conf_path(idle_nodes)))
    rem = Remediator(cfg.alerter, r, cfg.redis.key_prefix, ex, lambda d: True)
    det = {"schema": "vigil.detection/1", "id": "xid-list", "kind": "gpu_health",
           "state": "firing", "severity": "critical", "job": "train-1",
           "node": "gpu-[01,03-04]", "gpu": "3", "started_at": time.time(),
           "detected_at": time.time(), "metrics": ["xid"], "score": 10.0, "summary": "",
           "evidence": {"xid": 79, "action": "replace", "job_nodes": 4}}
    rem.consider(det, now=0.0)  # type: ignore[arg-type]
    [record] = rem.tick(now=cfg.alerter.confirm_seconds + 1)
    assert record["decision"] == "skipped" and "would touch 3 nodes" in record["why"]
    assert audit_log(r, cfg.redis.key_prefix)[0]["why"] == record["why"]
    assert set(sinfo_states(idle_nodes).values()) == {"idle"}
