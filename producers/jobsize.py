"""How many nodes the node's job runs on, where the scheduler says it, and so how many
shards its samples are keyed over (docs/sharding.md, ``contracts/shards.py``).

A job of more than ``detect.shard_nodes`` nodes is detected in shards; the agent
must key its samples ``job#k/K`` for the partition to be the shard's. The count:

- **Slurm**: the job's own tasks carry it in their environment
  (``SLURM_JOB_NUM_NODES``, or ``SLURM_NNODES``, or the node list
  ``SLURM_JOB_NODELIST`` / ``SLURM_NODELIST`` counted): the agent reads
  ``/proc/<pid>/environ`` of a process in the job's cgroup (the cgroups it attributes
  the job by, ``producers/attribution.py``; it runs as root to read NVML anyway).
- **Kubernetes**, or any other attribution: an explicit setting (``agent.job_nodes``),
  as a DaemonSet per training cluster sets it; the pod's own metadata is not read.

Unknown (no task started yet, environment unreadable, nothing set) → None: the job's
samples are keyed by job, one shard, as before. A count found is kept for the job's
life; an unknown one is asked again after ``RETRY_SECONDS``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from vigil_gpu_monitor.contracts.shards import shard_count

COUNT_VARS = ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
LIST_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
RETRY_SECONDS = 30.0
MAX_PIDS = 8  # processes of the job whose environment is read, at most, a look-up
MAX_JOBS = 64  # jobs remembered (a node runs a handful)
MAX_NODES = 1 << 20
_CGROUP_DIRS = ("system.slice/slurmstepd.scope/job_{id}", "*/slurm/uid_*/job_{id}",
                "slurm/uid_*/job_{id}")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def count_hostlist(text: str) -> int | None:
    """How many hosts a Slurm host list names (``gpu[001-004,010],login1``; several
    bracket groups in one name multiply); None when it does not read as one."""
    total = 0
    depth, start = 0, 0
    items = []
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        return None
    items.append(text[start:])
    for item in items:
        if not item:
            return None
        count = 1
        for group in re.findall(r"\[([^\]]*)\]", item):
            in_group = 0
            for part in group.split(","):
                match = _RANGE.match(part.strip())
                if not match:
                    return None
                low, high = int(match.group(1)), int(match.group(2) or match.group(1))
                if high < low:
                    return None
                in_group += high - low + 1
            count *= in_group
        total += count
        if total > MAX_NODES:
            return None
    return total or None


def nodes_from_environ(raw: bytes) -> int | None:
    """The job's node count from one process's ``/proc/<pid>/environ`` (None: not there)."""
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key.startswith(b"SLURM_"):
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    for var in COUNT_VARS:
        text = env.get(var, "").strip()
        if text.isdigit() and 0 < int(text) <= MAX_NODES:
            return int(text)
    for var in LIST_VARS:
        if env.get(var):
            found = count_hostlist(env[var].strip())
            if found:
                return found
    return None


class SlurmJobNodes:
    """A Slurm job's node count from its tasks' environment (roots injectable)."""

    def __init__(self, cgroup_root: str | Path = "/sys/fs/cgroup",
                 proc_root: str | Path = "/proc",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cgroups = Path(cgroup_root)
        self.proc = Path(proc_root)
        self.clock = clock
        self.known: dict[str, int] = {}
        self.asked: dict[str, float] = {}  # job → when it was last looked up in vain

    def __call__(self, job: str) -> int | None:
        if job in self.known:
            return self.known[job]
        now = self.clock()
        if not job.isdigit() or now - self.asked.get(job, now - RETRY_SECONDS) < RETRY_SECONDS:
            return None
        found = self._look_up(job)
        if len(self.known) >= MAX_JOBS:
            self.known.clear()
        if len(self.asked) >= MAX_JOBS:
            self.asked.clear()
        if found is None:
            self.asked[job] = now
        else:
            self.known[job] = found
            self.asked.pop(job, None)
        return found

    def _look_up(self, job: str) -> int | None:
        read = 0
        for pattern in _CGROUP_DIRS:
            for job_dir in self.cgroups.glob(pattern.format(id=job)):
                for procs in sorted(job_dir.rglob("cgroup.procs")):
                    for pid in _pids(procs):
                        if read >= MAX_PIDS:
                            return None
                        read += 1
                        try:
                            raw = (self.proc / pid / "environ").read_bytes()
                        except OSError:  # gone, or not ours to read
                            continue
                        found = nodes_from_environ(raw)
                        if found:
                            return found
        return None


def _pids(procs: Path) -> list[str]:
    try:
        text = procs.read_text()
    except OSError:
        return []
    return [p for p in text.split() if p.isdigit()]


class JobShards:
    """job → its shard count for the samples' keys: ``ceil(nodes / shard_nodes)``
    where the job's node count is known, else 1 (keyed by job, as before)."""

    def __init__(self, nodes_of: Callable[[str], int | None], shard_nodes: int) -> None:
        self.nodes_of = nodes_of
        self.shard_nodes = shard_nodes

    def __call__(self, job: str) -> int:
        nodes = self.nodes_of(job)
        return shard_count(nodes, self.shard_nodes) if nodes else 1


def fixed_nodes(count: int) -> Callable[[str], int | None]:
    """Every job's node count is ``count`` (``agent.job_nodes``; 0: unknown)."""
    return lambda job: count or None
