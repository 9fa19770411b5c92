"""A synthetic GPU cluster that emits ``vigil.sample/1`` messages with known faults.

Each job trains synchronously: every step, each GPU computes, then all wait for the
slowest and communicate. A slowed GPU therefore looks *busier* than its peers (it
computes while they spin in NCCL), which is what Vigil must notice. Job types:
data parallel; pipeline parallel, whose stages legitimately differ (the last stage
carries the loss); mixture-of-experts, with heavy all-to-all and an expert
imbalance that rotates. Healthy look-alikes (warm-up, checkpoints, evaluation
pauses, idle PCIe power saving, clock skew, lost and reordered messages) sit beside
injected faults, each listed as a ground-truth label.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from contracts import SAMPLE_SCHEMA
from contracts.messages import Sample

GPUS_PER_NODE = 8
NOMINAL_SM_CLOCK = 1980.0
GIB = float(1 << 30)
NVLINK_PEAK = 300e9  # bytes/s one GPU moves at full all-reduce speed
IB_PEAK = 50e9  # bytes/s of a 400 Gb/s port
# NVML clocks-event reasons used by the faults below.
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_THERMAL = 0x40

# fault kind → detection kinds that correctly report it (the first is its own kind)
FAULT_KINDS: dict[str, tuple[str, ...]] = {
    "slow_gpu": ("straggler",),
    "slow_node": ("straggler",),
    "thermal": ("gpu_health", "straggler"),
    "nvlink_degraded": ("link_health", "straggler"),
    "nic_degraded": ("link_health", "straggler"),
    "pcie_downgrade": ("link_health",),
    "xid": ("gpu_health",),
    "ecc_dbe": ("gpu_health",),
    "gpu_lost": ("gpu_health",),
    "hang": ("hang",),
    "node_silent": ("node_silent",),
    "network_phase": ("network_bound",),
    # physics the detectors were not designed around (issue #14's held-out classes)
    "slow_gpu_quiet": ("straggler",),  # slower with no clock change and no flag
    "slow_host": ("straggler",),  # a node's host (CPU, data loader) slows its GPUs
    "thermal_creep": ("gpu_health", "straggler"),  # slows by `severity` over 10 min
}
JOB_LEVEL_FAULTS = {"hang", "network_phase"}
NODE_LEVEL_FAULTS = {"slow_node", "nic_degraded", "node_silent", "slow_host"}
CREEP_SECONDS = 600.0  # thermal_creep reaches its full slowdown after this long


@dataclass(frozen=True)
class Fault:
    """One injected fault; also its ground-truth label."""

    kind: str
    job: str
    node: str | None
    gpu: str | None
    start: float
    end: float | None = None
    severity: float = 1.3  # slow_gpu/slow_node: compute multiplier; xid: the code

    def active(self, t: float) -> bool:
        """True while the fault is in effect at true time ``t``."""
        return self.start <= t and (self.end is None or t < self.end)


@dataclass(frozen=True)
class Event:
    """A healthy whole-job phase: warmup, checkpoint or eval."""

    kind: str
    start: float
    end: float


@dataclass
class JobSpec:
    """One synchronous training job spread over whole nodes."""

    name: str
    nodes: list[str]
    kind: str = "data_parallel"  # data_parallel | pipeline | moe
    gpus_per_node: int = GPUS_PER_NODE
    compute_seconds: float = 0.8  # per step, healthy GPU
    comm_seconds: float = 0.2  # per step, after the barrier
    stages: int = 4  # pipeline: nodes are split into this many stages
    events: list[Event] = field(default_factory=list)
    # MoE expert load that rotates smoothly between GPUs: ±amplitude, one turn per
    # period (0 = the classic random hot expert instead)
    moe_rotation_seconds: float = 0.0
    moe_amplitude: float = 0.2
    # MoE hot expert that dwells on one GPU this long, then moves to another (0 = off)
    moe_dwell_seconds: float = 0.0
    heterogeneity: float = 0.0  # static per-GPU compute spread (silicon, cooling), σ
    leaves: dict[str, float] = field(default_factory=dict)  # node → time it leaves the job

    def stage_of(self, node_index: int) -> int:
        """Pipeline stage of a node (nodes are assigned round-robin, so DP replicas align)."""
        return node_index % max(1, min(self.stages, len(self.nodes)))


@dataclass
class Cluster:
    """The jobs and faults of one simulation, plus the message-path impairments."""

    jobs: list[JobSpec]
    faults: list[Fault] = field(default_factory=list)
    skew_seconds: float = 0.0  # node clocks offset uniformly in ±skew
    loss: float = 0.0  # share of messages lost
    node_loss: dict[str, float] = field(default_factory=dict)  # node → its own loss share
    drift: dict[str, float] = field(default_factory=dict)  # node → clock drift, s per hour
    offsets: dict[str, float] = field(default_factory=dict)  # node → fixed clock offset, s
    reorder_seconds: float = 0.0  # messages arrive up to this late

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


@dataclass
class _GpuState:
    busy: float  # share of the step computing
    comm: float  # share of the step communicating
    slow: float  # clock slowdown factor (1 = nominal)
    nvlink_factor: float = 1.0
    throttle: int = 0
    hot: bool = False
    heat: float = 0.0  # thermal creep's progress, 0..1


class Simulator:
    """Generates samples tick by tick, deterministic per seed."""

    def __init__(self, cluster: Cluster, start: float, seed: int = 0, tick: float = 1.0) -> None:
        self.cluster = cluster
        self.start = start
        self.tick = tick
        self._rng = random.Random(seed)
        nodes = [n for job in cluster.jobs for n in job.nodes]
        self._skew = {n: self._rng.uniform(-1, 1) * cluster.skew_seconds for n in nodes}
        self._ecc: dict[tuple[str, str], float] = {}
        self._ib_errors: dict[str, float] = {}
        self._moe_hot: dict[str, tuple[str, str]] = {}
        # the newer physics draws from its own generator, so adding it left every
        # older scenario's samples exactly as they were
        self._physics = random.Random(f"{seed}-physics")
        self._drawn: dict[tuple[str, ...], float] = {}  # physics drawn once, then fixed
        # job → [(true time, actual step / healthy step)], one per tick: the ground
        # truth of what the job's faults cost (inf while it hangs)
        self.truth: dict[str, list[tuple[float, float]]] = {}

    def _faults(self, job: str, t: float) -> list[Fault]:
        return [f for f in self.cluster.faults if f.job == job and f.active(t)]

    def samples(self, duration: float) -> Iterator[Sample]:
        """Every node's sample per tick over ``duration`` seconds, in arrival order."""
        ticks = int(math.ceil(duration / self.tick))
        pending: list[tuple[float, int, Sample]] = []
        seq = 0
        for i in range(ticks):
            t = self.start + (i + 1) * self.tick
            for job in self.cluster.jobs:
                for sample in self._job_tick(job, t):
                    if self._rng.random() < self.cluster.loss:
                        continue
                    own_loss = self.cluster.node_loss.get(sample["node"], 0.0)
                    if own_loss and self._physics.random() < own_loss:
                        continue
                    arrival = t + self._rng.uniform(0, self.cluster.reorder_seconds)
                    pending.append((arrival, seq, sample))
                    seq += 1
            pending.sort(key=lambda p: (p[0], p[1]))
            while pending and pending[0][0] <= t:
                yield pending.pop(0)[2]
        yield from (p[2] for p in pending)

    def _event(self, job: JobSpec, t: float) -> str | None:
        return next((e.kind for e in job.events if e.start <= t < e.end), None)

    def _job_tick(self, job: JobSpec, t: float) -> Iterator[Sample]:
        rng = self._rng
        faults = self._faults(job.name, t)
        kinds = {f.kind for f in faults}
        event = self._event(job, t)
        comm = job.comm_seconds * rng.gauss(1.0, 0.01)
        if job.kind == "moe":
            comm *= 1.5
        healthy_comm = comm
        if job.kind == "moe" and "network_phase" in kinds:
            comm *= 8.0 / 1.5
        if "nvlink_degraded" in kinds:
            comm *= 1.4
        if "nic_degraded" in kinds:
            comm *= 1.6
        if job.kind == "moe" and not (job.moe_rotation_seconds or job.moe_dwell_seconds) and (
                job.name not in self._moe_hot or rng.random() < 0.5):
            node = rng.choice(job.nodes)
            self._moe_hot[job.name] = (node, str(rng.randrange(job.gpus_per_node)))
        compute: dict[tuple[str, str], float] = {}
        healthy: dict[tuple[str, str], float] = {}
        states: dict[tuple[str, str], _GpuState] = {}
        gone = {n for n, at in job.leaves.items() if at <= t}
        for n, node in enumerate(job.nodes):
            if node in gone:
                continue
            stage_factor = 1.0
            if job.kind == "pipeline":
                stage = job.stage_of(n)
                stage_factor = 1.25 if stage == min(job.stages, len(job.nodes)) - 1 else (
                    1.05 if stage == 0 else 1.0)
            for g in range(job.gpus_per_node):
                key = (node, str(g))
                factor = stage_factor
                fault_factor = 1.0
                st = _GpuState(0.0, 0.0, 1.0)
                factor *= self._workload_factor(job, t, n, g)
                for f in faults:
                    if f.node != node:
                        continue
                    if f.kind == "slow_host" or (f.kind == "slow_gpu_quiet" and f.gpu == str(g)):
                        fault_factor *= f.severity  # no clock change, no flag
                    elif f.kind == "thermal_creep" and f.gpu == str(g):
                        heat = min(1.0, (t - f.start) / CREEP_SECONDS)
                        slow = 1.0 + (f.severity - 1.0) * heat
                        fault_factor *= slow
                        st.slow, st.heat = slow, heat
                        st.throttle = THROTTLE_HW_THERMAL if heat >= 0.5 else 0
                    elif f.kind == "slow_node" or (f.kind == "slow_gpu" and f.gpu == str(g)):
                        fault_factor *= f.severity
                        st.slow, st.throttle = f.severity, THROTTLE_SW_POWER_CAP
                    elif f.kind == "thermal" and f.gpu == str(g):
                        fault_factor *= 1.25
                        st.slow, st.throttle, st.hot = 1.25, THROTTLE_HW_THERMAL, True
                    elif f.kind == "nvlink_degraded" and f.gpu == str(g):
                        st.nvlink_factor = 0.55
                if job.kind == "moe" and self._moe_hot.get(job.name) == key:
                    factor *= 1.2
                if event == "warmup":
                    factor *= rng.uniform(0.9, 1.1)
                healthy[key] = job.compute_seconds * rng.gauss(1.0, 0.015) * factor
                compute[key] = healthy[key] * fault_factor
                states[key] = st
        step = max(compute.values()) + comm
        self.truth.setdefault(job.name, []).append(
            (t, math.inf if "hang" in kinds else step / (max(healthy.values()) + healthy_comm)))
        for key, st in states.items():
            st.busy = compute[key] / step
            st.comm = comm / step
        for node in job.nodes:
            if any(f.kind == "node_silent" and f.node == node for f in faults):
                continue
            if node in gone:  # left the job: idle, reporting under no job
                idle = {(node, str(g)): _GpuState(0.0, 0.0, 1.0)
                        for g in range(job.gpus_per_node)}
                yield {**self._node_sample(job, node, t, idle, [], None, set()), "job": ""}
                continue
            yield self._node_sample(job, node, t, states, faults, event, kinds)

    def _workload_factor(self, job: JobSpec, t: float, node_index: int, gpu: int) -> float:
        """Healthy compute differences: static per-GPU spread, and MoE expert load that
        rotates smoothly between GPUs (each GPU peaks once per rotation, at its own
        phase: where its experts sit)."""
        factor = 1.0
        node, physics = job.nodes[node_index], self._physics
        if job.heterogeneity:
            factor *= self._draw((job.name, node, str(gpu), "spread"), lambda: max(
                0.8, physics.gauss(1.0, job.heterogeneity)))
        if job.kind == "moe" and job.moe_rotation_seconds:
            phase = self._draw((job.name, node, str(gpu), "phase"), physics.random)
            factor *= 1.0 + job.moe_amplitude * math.cos(
                2 * math.pi * ((t - self.start) / job.moe_rotation_seconds - phase))
        if job.kind == "moe" and job.moe_dwell_seconds:
            turn = int((t - self.start) // job.moe_dwell_seconds)
            hot = self._draw((job.name, str(turn), "hot"), lambda: float(
                physics.randrange(len(job.nodes) * job.gpus_per_node)))
            if hot == node_index * job.gpus_per_node + gpu:
                factor *= 1.0 + job.moe_amplitude
        return factor

    def _draw(self, key: tuple[str, ...], draw: Callable[[], float]) -> float:
        """A physics value drawn the first time ``key`` is asked for, then fixed (a
        GPU's spread, its experts' phase, where the hot expert sits in a turn)."""
        if key not in self._drawn:
            self._drawn[key] = draw()
        return self._drawn[key]

    def _node_sample(self, job: JobSpec, node: str, t: float,
                     states: dict[tuple[str, str], _GpuState], faults: list[Fault],
                     event: str | None, kinds: set[str]) -> Sample:
        rng = self._rng
        gpus: dict[str, dict[str, float]] = {}
        for g in range(job.gpus_per_node):
            gpu = str(g)
            mine = [f for f in faults if f.node == node and f.gpu == gpu]
            if any(f.kind == "gpu_lost" and t >= f.start + 1 for f in mine):
                continue  # fell off the bus: no reading at all
            reading = self._gpu_reading(states[(node, gpu)], event, "hang" in kinds)
            for f in mine:
                self._apply_gpu_fault(f, reading, t, (node, gpu))
            reading["ecc_dbe"] = self._ecc.get((node, gpu), 0.0)
            gpus[gpu] = reading
        nic_degraded = any(f.kind == "nic_degraded" and f.node == node for f in faults)
        comm_share = states[(node, "0")].comm if (node, "0") in states else 0.0
        nics = {}
        for k in range(2):
            name = f"mlx5_{k}"
            moving = 0.0 if ("hang" in kinds or event in ("checkpoint", "eval")) else comm_share
            util = 0.7 if job.kind == "moe" else 0.5
            rate = 200.0 if nic_degraded and k == 0 else 400.0
            tx = moving * IB_PEAK * util * (rate / 400.0 if nic_degraded else 1.0)
            if nic_degraded and k == 0:
                self._ib_errors[node] = self._ib_errors.get(node, 0.0) + rng.randint(2, 9)
            wait = (2e6 if nic_degraded else 2e3) * (0.2 + moving)
            nics[name] = {"ib_tx": tx * rng.gauss(1.0, 0.02), "ib_rx": tx * rng.gauss(1.0, 0.02),
                          "ib_rate": rate, "ib_errors": self._ib_errors.get(node, 0.0)
                          if k == 0 else 0.0,
                          "ib_xmit_wait": abs(rng.gauss(wait, wait * 0.1))}
        return {
            "schema": SAMPLE_SCHEMA, "ts": round(t + self._clock(node, t), 3),
            "job": job.name, "node": node, "gpus": gpus,
            "host": {"cpu_util": self._cpu_util(node, faults), "mem_used": 400 * GIB},
            "nics": nics,
            "meta": {"agent": "vigil-simulator", "gpu_model": "H100-SXM", "sm_count": 132},
        }

    def _clock(self, node: str, t: float) -> float:
        """How far the node's clock is off true time ``t``: the suite's random skew, a
        fixed offset, and a drift that grows with time."""
        c = self.cluster
        return (self._skew.get(node, 0.0) + c.offsets.get(node, 0.0)
                + c.drift.get(node, 0.0) * (t - self.start) / 3600.0)

    def _cpu_util(self, node: str, faults: list[Fault]) -> float:
        busy = _clip(self._rng.gauss(0.35, 0.03))  # drawn always: older scenarios unchanged
        if any(f.kind == "slow_host" and f.node == node for f in faults):
            return _clip(0.97 + 0.02 * self._physics.random())
        return busy

    def _apply_gpu_fault(self, f: Fault, reading: dict[str, float], t: float,
                         key: tuple[str, str]) -> None:
        if f.kind == "xid" and t - self.tick < f.start <= t:
            reading["xid"] = float(f.severity)
        elif f.kind == "gpu_lost" and t - self.tick < f.start <= t:
            reading["xid"] = 79.0
        elif f.kind == "ecc_dbe" and t - self.tick < f.start <= t:
            self._ecc[key] = self._ecc.get(key, 0.0) + 1
            reading["xid"] = 48.0
        elif f.kind == "pcie_downgrade":
            reading["pcie_gen"], reading["pcie_width"] = 3.0, 8.0

    def _gpu_reading(self, st: _GpuState, event: str | None, hung: bool) -> dict[str, float]:
        rng = self._rng

        def noisy(x: float, sd: float = 0.01) -> float:
            return _clip(x + rng.gauss(0.0, sd))

        busy, comm = st.busy, st.comm
        wait = max(0.0, 1.0 - busy - comm)
        sm = 0.92 * busy + 0.12 * comm + 0.008 * wait
        tensor, dram, util = 0.42 * busy, 0.38 * busy + 0.15 * comm, 0.99
        nvlink = comm * NVLINK_PEAK * 0.5 * st.nvlink_factor
        pcie_tx, pcie_gen = abs(rng.gauss(1.2e9, 1e8)), 5.0
        if hung:  # a spinning NCCL kernel: 100% "utilisation", 1/132 of the SMs
            sm, tensor, dram, util, nvlink, busy = 1 / 132, 0.0, 0.01, 1.0, 0.0, 0.0
        elif event == "checkpoint":
            sm, tensor, dram, util, nvlink, busy = 0.01, 0.0, 0.05, 0.05, 0.0, 0.0
            pcie_tx = abs(rng.gauss(12e9, 5e8))
        elif event == "eval":
            sm, tensor, dram, util, nvlink, busy = 0.3, 0.15, 0.2, 0.7, 0.0, 0.25
            pcie_gen = 1.0 if rng.random() < 0.3 else 5.0  # idle power saving
        elif event == "warmup":
            sm, tensor = sm * 0.6, tensor * 0.5
        clock = NOMINAL_SM_CLOCK / st.slow
        return {
            "sm_active": noisy(sm),
            "sm_occupancy": noisy(0.55 * busy + 0.05 * comm),
            "tensor_active": noisy(tensor),
            "fp16_active": noisy(0.08 * busy),
            "fp32_active": noisy(0.05 * busy + 0.02 * comm),
            "fp64_active": 0.0,
            "dram_active": noisy(dram),
            "gpu_util": noisy(util, 0.003),
            "power": max(60.0, rng.gauss(120 + 520 * busy + 80 * comm, 8.0)),
            "temperature": rng.gauss(90.0 if st.hot else 55 + 22 * busy + 30 * st.heat, 0.8),
            "sm_clock": round(clock + rng.gauss(0, 5)),
            "mem_clock": 2619.0,
            "mem_used": 71.5 * GIB,
            "nvlink_tx": nvlink * rng.gauss(1.0, 0.02),
            "nvlink_rx": nvlink * rng.gauss(1.0, 0.02),
            "pcie_tx": pcie_tx,
            "pcie_rx": abs(rng.gauss(1.5e9, 1e8)),
            "pcie_gen": pcie_gen,
            "pcie_width": 16.0,
            "ecc_sbe": 0.0,
            "ecc_dbe": 0.0,
            "xid": 0.0,
            "throttle": float(st.throttle),
        }
