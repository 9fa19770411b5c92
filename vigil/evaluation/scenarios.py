"""The detection scenario suite: every fault on every job type, and healthy look-alikes.

Each scenario is one job of N nodes simulated for ``duration`` seconds, with
warm-up, a checkpoint, clock skew, 1 % lost messages and out-of-order arrival; a
fault scenario injects one fault at ``FAULT_AT`` seconds; a healthy scenario adds
an evaluation pause instead (idle PCIe links drop their generation there).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from vigil_gpu_monitor.simulator.cluster import Cluster, Event, Fault, JobSpec

JOB_TYPES = ("data_parallel", "pipeline", "moe")
FAULTS = ("slow_gpu", "slow_node", "thermal", "nvlink_degraded", "nic_degraded",
          "pcie_downgrade", "xid", "ecc_dbe", "gpu_lost", "hang", "node_silent", "network_phase")
SIZES = (2, 4, 8, 16, 32, 64)
START = 1_800_000_000.0
FAULT_AT = 120.0
DURATION = 240.0
XID_CODES = (79, 48, 94, 13, 74)


@dataclass
class Scenario:
    """One trace to generate and score."""

    name: str
    cluster: Cluster
    seed: int
    duration: float = DURATION
    start: float = START

    @property
    def healthy(self) -> bool:
        return not self.cluster.faults


def _job(job_type: str, nodes: int, seed: int, healthy: bool) -> JobSpec:
    events = [Event("warmup", START, START + 40), Event("checkpoint", START + 60, START + 80)]
    if healthy:
        events.append(Event("eval", START + 150, START + 190))
    return JobSpec(f"{job_type}-{nodes}n-s{seed}", [f"node-{i:03d}" for i in range(nodes)],
                   kind=job_type, events=events)


def _fault(kind: str, job: JobSpec, rng: random.Random) -> Fault:
    node = rng.choice(job.nodes)
    gpu = str(rng.randrange(job.gpus_per_node))
    at = START + FAULT_AT
    if kind in ("hang", "network_phase"):
        return Fault(kind, job.name, None, None, at)
    if kind in ("slow_node", "nic_degraded", "node_silent"):
        return Fault(kind, job.name, node, None, at, severity=1.25)
    if kind == "xid":
        return Fault(kind, job.name, node, gpu, at, severity=float(rng.choice(XID_CODES)))
    return Fault(kind, job.name, node, gpu, at, severity=1.3)


def suite(sizes: tuple[int, ...] = SIZES, seeds: tuple[int, ...] = (1, 2),
          job_types: tuple[str, ...] = JOB_TYPES,
          faults: tuple[str, ...] = FAULTS) -> list[Scenario]:
    """All fault scenarios (network phases only on MoE) plus one healthy per combination."""
    out = []
    for seed in seeds:
        for job_type in job_types:
            for nodes in sizes:
                rng = random.Random(f"{seed}-{job_type}-{nodes}")
                for kind in (*faults, None):
                    if kind == "network_phase" and job_type != "moe":
                        continue
                    if kind == "slow_node" and nodes < 3:
                        continue  # no node-level peers to compare with
                    job = _job(job_type, nodes, seed, healthy=kind is None)
                    cluster = Cluster([job], [_fault(kind, job, rng)] if kind else [],
                                      skew_seconds=3.0, loss=0.01, reorder_seconds=2.0)
                    out.append(Scenario(f"{job.name}-{kind or 'healthy'}", cluster, seed))
    return out
