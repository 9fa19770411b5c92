"""The agent's knowledge of its job's node count, and so of the shard its samples are
keyed by (issue #46, docs/sharding.md): from a Slurm job's tasks' environment (a
cgroup and a /proc tree laid out under tmp_path, as the kernel lays them out), or
from ``agent.job_nodes``; unknown → one shard, keyed by job."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.config import AgentConfig, Config, DetectConfig
from vigil_gpu_monitor.contracts.errors import ConfigError
from vigil_gpu_monitor.contracts.shards import shard_key
from vigil_gpu_monitor.producers.jobsize import (
    RETRY_SECONDS,
    JobShards,
    SlurmJobNodes,
    count_hostlist,
    nodes_from_environ,
)
from vigil_gpu_monitor.producers.publisher import sample_key
from vigil_gpu_monitor.vigil.agentcmd import build_shards


@pytest.mark.parametrize(("text", "count"), [
    ("gpu001", 1), ("gpu[001-004]", 4), ("gpu[001-004,010],login1", 6),
    ("rack[1-2]-n[01-16]", 32), ("a[0-2047]", 2048), ("n[1,3,5-7]", 5),
])
def test_a_slurm_host_list_is_counted(text: str, count: int) -> None:
    assert count_hostlist(text) == count


@pytest.mark.parametrize("text", ["", "gpu[1-", "gpu]1[", "n[4-2]", "n[a-b]", "a,,b"])
def test_a_host_list_that_does_not_read_is_unknown(text: str) -> None:
    assert count_hostlist(text) is None


def test_the_count_comes_from_the_count_variables_first_then_the_node_list() -> None:
    env = b"PATH=/bin\0SLURM_JOB_NUM_NODES=2048\0SLURM_JOB_NODELIST=n[1-2]\0"
    assert nodes_from_environ(env) == 2048
    assert nodes_from_environ(b"SLURM_NNODES=16\0") == 16
    assert nodes_from_environ(b"SLURM_JOB_NODELIST=n[0001-1024]\0HOME=/root") == 1024
    assert nodes_from_environ(b"SLURM_JOB_NUM_NODES=many\0") is None
    assert nodes_from_environ(b"SLURM_JOB_NUM_NODES=0\0") is None
    assert nodes_from_environ(b"\xff\xfe=\0garbage") is None


def _slurm_tree(root: Path, job: str, environ: bytes | None) -> tuple[Path, Path]:
    """A cgroup v2 tree with one task of ``job`` (pid 4242), and its /proc entry."""
    cgroups, proc = root / "cgroup", root / "proc"
    step = cgroups / "system.slice" / "slurmstepd.scope" / f"job_{job}" / "step_0" / "user"
    step.mkdir(parents=True)
    (step / "cgroup.procs").write_text("4242\n")
    (cgroups / "system.slice" / "slurmstepd.scope" / f"job_{job}" / "cgroup.procs").write_text("")
    (proc / "4242").mkdir(parents=True)
    if environ is not None:
        (proc / "4242" / "environ").write_bytes(environ)
    return cgroups, proc


def test_a_slurm_jobs_count_is_read_from_its_tasks_environment(tmp_path: Path) -> None:
    cgroups, proc = _slurm_tree(tmp_path, "812", b"SLURM_JOB_NUM_NODES=2048\0")
    nodes = SlurmJobNodes(cgroups, proc)
    assert nodes("812") == 2048
    (proc / "4242" / "environ").write_bytes(b"SLURM_JOB_NUM_NODES=1\0")
    assert nodes("812") == 2048  # a job's count is kept for its life
    assert nodes("999") is None  # not on this node
    assert nodes("") is None and nodes("../../etc") is None


def test_an_unknown_count_is_asked_again_only_after_a_while(tmp_path: Path) -> None:
    now = [1000.0]
    cgroups, proc = _slurm_tree(tmp_path, "7", None)  # its task's environment unreadable
    nodes = SlurmJobNodes(cgroups, proc, clock=lambda: now[0])
    assert nodes("7") is None
    (proc / "4242" / "environ").write_bytes(b"SLURM_NNODES=4096\0")
    now[0] += RETRY_SECONDS / 2
    assert nodes("7") is None  # not asked again yet
    now[0] += RETRY_SECONDS
    assert nodes("7") == 4096


def test_the_agent_keys_a_big_job_by_shard_and_an_unknown_one_by_job(tmp_path: Path) -> None:
    shards = JobShards(lambda job: {"big": 4096, "small": 100}.get(job), 1024)
    assert shards("big") == 4 and shards("small") == 1 and shards("unknown") == 1
    sample = {"job": "big", "node": "node-0042"}
    assert sample_key(sample, shards) == shard_key("big", "node-0042", 4).encode()  # type: ignore[arg-type]
    assert sample_key({**sample, "job": "unknown"}, shards) == b"unknown"  # type: ignore[arg-type]

    cgroups, proc = _slurm_tree(tmp_path, "55", b"SLURM_JOB_NUM_NODES=3000\0")
    slurm = Config(agent=AgentConfig(attribution="slurm", cgroup_root=str(cgroups),
                                     proc_root=str(proc)), detect=DetectConfig(shard_nodes=1024))
    assert build_shards(slurm)("55") == 3
    fixed = Config(agent=AgentConfig(attribution="kubernetes", job_nodes=2048))
    assert build_shards(fixed)("any") == 2
    assert build_shards(Config())("any") == 1  # static, nothing set: one shard
    with pytest.raises(ConfigError, match="agent.job_nodes"):
        build_shards(Config(agent=AgentConfig(job_nodes=-1)))
