"""Which job the node's GPUs belong to, without touching the workload.

- ``static``: a job id from configuration (or none: ``""``).
- ``slurm``: the Slurm job(s) whose cgroups exist on this node, found under the
  cgroup root (v2: ``…/job_<id>/``; v1: ``…/slurm/uid_<u>/job_<id>/``). One job →
  its id; several → the lowest id, with all of them in ``meta``. No job → ``""``.

- ``kubernetes``: the pods holding the node's GPUs, from the kubelet's PodResources
  API (``producers/podresources.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

_JOB_DIR = re.compile(r"^job_(\d+)$")


class StaticJob:
    """Always the configured job id."""

    def __init__(self, job: str = "") -> None:
        self.job = job

    def __call__(self) -> str:
        return self.job


class SlurmJob:
    """The Slurm job running on this node, from the cgroup tree (root injectable)."""

    def __init__(self, cgroup_root: str | Path = "/sys/fs/cgroup") -> None:
        self.root = Path(cgroup_root)

    def __call__(self) -> str:
        jobs: set[int] = set()
        for pattern in ("system.slice/slurmstepd.scope/job_*", "*/slurm/uid_*/job_*",
                        "slurm/uid_*/job_*"):
            for path in self.root.glob(pattern):
                match = _JOB_DIR.match(path.name)
                if match and path.is_dir():
                    jobs.add(int(match.group(1)))
        return str(min(jobs)) if jobs else ""  # several: the oldest (lowest) job id
