"""A synthetic GPU cluster that emits ``vigil.sample/1`` messages with known faults.

Each job trains synchronously: every step, each GPU computes, then all wait for the
slowest and communicate. A slowed GPU therefore looks *busier* than its peers
(it computes while they spin in NCCL), which is what Vigil must notice. Faults are
injected on a schedule and listed as ground-truth labels.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from contracts import SAMPLE_SCHEMA

GPUS_PER_NODE = 8
NOMINAL_SM_CLOCK = 1980.0
GIB = float(1 << 30)
# NVML clocks-event reasons used by the faults below.
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8


@dataclass(frozen=True)
class Fault:
    """One injected fault; also its ground-truth label."""

    kind: str  # slow_gpu
    job: str
    node: str
    gpu: str | None
    start: float
    end: float | None = None
    severity: float = 1.3  # slow_gpu: compute-time multiplier

    def active(self, t: float) -> bool:
        """True while the fault is in effect at event time ``t``."""
        return self.start <= t and (self.end is None or t < self.end)


@dataclass
class JobSpec:
    """One synchronous training job spread over whole nodes."""

    name: str
    nodes: list[str]
    gpus_per_node: int = GPUS_PER_NODE
    compute_seconds: float = 0.8  # per step, healthy GPU
    comm_seconds: float = 0.2  # per step, after the barrier


@dataclass
class Cluster:
    """The jobs and the faults of one simulation."""

    jobs: list[JobSpec]
    faults: list[Fault] = field(default_factory=list)

    def labels(self) -> list[dict[str, Any]]:
        """Ground truth: one dict per injected fault."""
        return [asdict(f) for f in self.faults]


def demo_cluster(jobs: int = 2, nodes: int = 4, start: float = 0.0,
                 slow_after: float = 60.0) -> Cluster:
    """A few healthy data-parallel jobs; one GPU of the first job slows down."""
    specs = [JobSpec(f"job-{j:03d}", [f"gpu-node-{j:02d}-{n:02d}" for n in range(nodes)])
             for j in range(jobs)]
    faults = [Fault("slow_gpu", specs[0].name, specs[0].nodes[min(1, nodes - 1)], "3",
                    start + slow_after)] if specs else []
    return Cluster(specs, faults)


def _clip(value: float, low: float = 0.0, high: float = 1.0) -> float:
    return min(high, max(low, value))


class Simulator:
    """Generates samples tick by tick, in event-time order, deterministic per seed."""

    def __init__(self, cluster: Cluster, start: float, seed: int = 0, tick: float = 1.0) -> None:
        self.cluster = cluster
        self.start = start
        self.tick = tick
        self._rng = random.Random(seed)

    def _faults(self, job: str, t: float) -> list[Fault]:
        return [f for f in self.cluster.faults if f.job == job and f.active(t)]

    def samples(self, duration: float) -> Iterator[dict[str, Any]]:
        """Every node's sample for each tick in ``[start, start + duration)``."""
        ticks = int(math.ceil(duration / self.tick))
        for i in range(ticks):
            t = self.start + (i + 1) * self.tick
            for job in self.cluster.jobs:
                yield from self._job_tick(job, t)

    def _job_tick(self, job: JobSpec, t: float) -> Iterator[dict[str, Any]]:
        rng = self._rng
        faults = self._faults(job.name, t)
        slow = {(f.node, f.gpu): f.severity for f in faults if f.kind == "slow_gpu"}
        compute: dict[tuple[str, str], float] = {}
        for node in job.nodes:
            for g in range(job.gpus_per_node):
                key = (node, str(g))
                compute[key] = (job.compute_seconds * rng.gauss(1.0, 0.015)
                                * slow.get(key, 1.0))
        step = max(compute.values()) + job.comm_seconds
        comm_share = job.comm_seconds / step
        for node in job.nodes:
            gpus = {}
            for g in range(job.gpus_per_node):
                key = (node, str(g))
                busy = compute[key] / step  # share of the step this GPU computes
                factor = slow.get(key, 1.0)
                gpus[str(g)] = self._gpu_reading(busy, comm_share, factor)
            nic_bytes = comm_share * 40e9 * rng.gauss(1.0, 0.02)
            nics = {f"mlx5_{k}": {"ib_tx": nic_bytes, "ib_rx": nic_bytes, "ib_rate": 400.0,
                                  "ib_errors": 0.0, "ib_xmit_wait": abs(rng.gauss(2e3, 2e2))}
                    for k in range(2)}
            yield {
                "schema": SAMPLE_SCHEMA, "ts": round(t, 3), "job": job.name, "node": node,
                "gpus": gpus,
                "host": {"cpu_util": _clip(rng.gauss(0.35, 0.03)), "mem_used": 400 * GIB},
                "nics": nics,
                "meta": {"agent": "vigil-simulator", "gpu_model": "H100-SXM"},
            }

    def _gpu_reading(self, busy: float, comm_share: float, slow_factor: float) -> dict[str, float]:
        rng = self._rng
        wait = max(0.0, 1.0 - busy - comm_share)

        def noisy(x: float, sd: float = 0.01) -> float:
            return _clip(x + rng.gauss(0.0, sd))

        sm_active = noisy(0.92 * busy + 0.12 * comm_share + 0.008 * wait)
        clock = NOMINAL_SM_CLOCK / slow_factor if slow_factor > 1.0 else NOMINAL_SM_CLOCK
        return {
            "sm_active": sm_active,
            "sm_occupancy": noisy(0.55 * busy + 0.05 * comm_share),
            "tensor_active": noisy(0.42 * busy),
            "fp16_active": noisy(0.08 * busy),
            "fp32_active": noisy(0.05 * busy + 0.02 * comm_share),
            "fp64_active": 0.0,
            "dram_active": noisy(0.38 * busy + 0.15 * comm_share),
            "gpu_util": noisy(0.99, 0.005),
            "power": max(60.0, rng.gauss(120 + 520 * busy + 80 * comm_share, 8.0)),
            "temperature": rng.gauss(55 + 22 * busy, 0.8),
            "sm_clock": round(clock + rng.gauss(0, 5)),
            "mem_clock": 2619.0,
            "mem_used": 71.5 * GIB,
            "nvlink_tx": comm_share * 150e9 * rng.gauss(1.0, 0.02),
            "nvlink_rx": comm_share * 150e9 * rng.gauss(1.0, 0.02),
            "pcie_tx": abs(rng.gauss(1.2e9, 1e8)),
            "pcie_rx": abs(rng.gauss(1.5e9, 1e8)),
            "pcie_gen": 5.0,
            "pcie_width": 16.0,
            "ecc_sbe": 0.0,
            "ecc_dbe": 0.0,
            "xid": 0.0,
            "throttle": float(THROTTLE_SW_POWER_CAP if slow_factor > 1.0 else 0),
        }
