"""A synthetic GPU cluster that emits ``vigil.sample/1`` messages with known faults.

Every job but serving replicas (``async_replicas``: no barrier, each replica's load its
own) trains synchronously. Within each step every GPU moves through phases:
it may wait idle for its node's input (no kernel: a data-loader-bound host), then
computes its share of the step, then waits in the collective for the slowest GPU
(NCCL spins on about 1/132 of the SMs, ``gpu_util`` reads 100 %), then communicates.
A reading is the average of that timeline over the agent's one-second window, and
each node samples at its own phase, so readings beat with the step (steps last
0.3 s to 30 s) and a node's median swings with its phase (``simulator/physics.py``
holds the counter definitions this follows).

Work and speed are kept apart, as the hardware keeps them. A GPU's compute time is
its work divided by its speed: more work (a hot MoE expert, an uneven memory-bound
shard) and a slower GPU (a stall, a lower clock) both stretch it, and only the
counters that measure work per elapsed cycle tell which. Job types: data parallel;
pipeline parallel, whose stages legitimately differ; mixture-of-experts with heavy
all-to-all and expert load that persists, wanders, jumps when experts are
re-placed, rotates or dwells. Healthy
look-alikes (warm-up, checkpoints, evaluation pauses, idle PCIe power saving, clock
skew, lost and reordered messages) sit beside injected faults, each listed as a
ground-truth label.

A job that carries an ``envelope`` (``simulator/envelope.py``) draws what the
documents leave open: the SMs a waiting GPU holds (one per NCCL channel), NVML's
last-period integer ``gpu_util``, the clock the driver holds at the power limit (0x4),
silicon and slot spread, tick jitter, stale DCGM fields, 4 or 8 NICs, a host gap in
each step. A job without one makes exactly the samples it made before.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from vigil_gpu_monitor.contracts import SAMPLE_SCHEMA
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.simulator.envelope import CLOCK_WANDER_SECONDS, Envelope, capped_clock
from vigil_gpu_monitor.simulator.physics import (
    COMMUNICATING_WATTS,
    IDLE_WATTS,
    NOMINAL_MEM_CLOCK,
    NOMINAL_SM_CLOCK,
    OCCUPANCY_PER_SPINNING_CTA,
    SM_CLOCK_STEP,
    SM_COUNT,
    SM_WHILE_WAITING,
    WAITING_WATTS,
    GpuPhases,
    Speed,
    computing_watts,
    counters,
    phase_shares,
)
from vigil_gpu_monitor.simulator.steps import StepTimings, rank_stall

GPUS_PER_NODE = 8
GIB = float(1 << 30)
NVLINK_PEAK = 300e9  # bytes/s one GPU moves at full all-reduce speed
IB_PEAK = 50e9  # bytes/s of a 400 Gb/s port
# NVML clocks-event reasons (nvmlClocksEventReasons) the driver and the faults set.
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
POWER_CONTROL_SECONDS = 1.0  # the driver's power capping holds the draw over about this
NOMINAL_COMPUTING_WATTS = 500.0  # what computing adds to idle at nominal (physics.py)
STALE_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "fp16_active", "fp32_active",
                "fp64_active", "dram_active")
JOB_KINDS = ("data_parallel", "dp_overlap", "fsdp", "tensor_parallel", "pipeline",
             "pipeline_1f1b", "moe", "async_replicas")

# fault kind → detection kinds that correctly report it (the first is its own kind)
FAULT_KINDS: dict[str, tuple[str, ...]] = {
    # a slowdown the driver flags: under the envelope as HW slowdown (0x8), which the
    # health check rightly reports too (0x4, the older suites' flag, it does not)
    "slow_gpu": ("straggler", "gpu_health"),
    "slow_node": ("straggler", "gpu_health"),
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
    "slow_gpu_quiet": ("straggler",),  # a stall: slower with no clock change, no flag
    # a node's host (CPU, data loader) keeps its GPUs waiting idle: nobody computes
    # longer, so no GPU is a straggler; the job's slowdown names the node
    "slow_host": ("slowdown", "straggler"),
    "thermal_creep": ("gpu_health", "straggler"),  # slows by `severity` over 10 min
    # the board's HW power brake (an external signal, e.g. the PSU): every GPU of the
    # node clocked down together, 0x80 set on each: one fault of the node
    "power_brake": ("gpu_health", "straggler"),
}
JOB_LEVEL_FAULTS = {"hang", "network_phase"}
NODE_LEVEL_FAULTS = {"slow_node", "nic_degraded", "node_silent", "slow_host", "power_brake"}
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
    """One job spread over whole nodes. Kinds (``JOB_KINDS``):

    - ``data_parallel``: compute, wait at the barrier, then all-reduce the gradients;
    - ``dp_overlap``: data parallel with ``overlap`` of the gradient bytes moved while
      the backward pass computes (bucketed all-reduce), the rest after the barrier;
    - ``fsdp``: all-gather and reduce-scatter, half again the bytes of data parallel,
      ``overlap`` of them during compute;
    - ``tensor_parallel``: groups of ``tp_size`` GPUs of a node all-reduce every layer
      over NVLink while they compute (a group moves in lock-step), and the groups
      all-reduce gradients after the barrier;
    - ``pipeline``: stages with legitimately different work; ``pipeline_1f1b``: a 1F1B
      schedule of ``microbatches`` per step, whose bubbles make every stage wait
      ``(stages - 1) / microbatches`` of the slowest stage's compute, with activations
      sent to the next stage while computing; stage work ``stage_work`` (per stage);
    - ``moe``: expert parallelism, all-to-all across nodes (``moe_across_nodes``) or
      inside a node over NVLink;
    - ``async_replicas``: independent serving replicas (``replica_gpus`` GPUs each, 1
      or a whole node) with no barrier: each replica's load is its own, request-driven
      and bursty; no collective waits, little cross-node traffic.

    ``envelope``: this job's draw of what the documents leave open
    (``simulator/envelope.py``); ``None`` keeps the physics every older suite pins.
    """

    name: str
    nodes: list[str]
    kind: str = "data_parallel"  # one of JOB_KINDS
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
    # MoE expert load as the published measurements have it: a persistent per-GPU
    # share that wanders slowly (σ, time constant in steps), jumps when the balancer
    # re-places experts (every so many steps; 0: never), and GPUs whose experts stay
    # hot for good (their count, at ``moe_amplitude`` above the rest)
    moe_walk_sigma: float = 0.0
    moe_walk_steps: float = 500.0
    moe_replace_steps: float = 0.0
    moe_fixed_hot: int = 0
    moe_step_noise: float = 0.03  # per-step token noise of each GPU's share
    leaves: dict[str, float] = field(default_factory=dict)  # node → time it leaves the job
    # the first so many GPUs of each node do this much more work, all of it in
    # memory-bound kernels (embedding shards, uneven vocabulary or optimizer shards)
    memory_work_gpus: int = 0
    memory_work_extra: float = 0.0
    envelope: Envelope | None = None
    overlap: float = 0.7  # dp_overlap / fsdp: share of the step's bytes moved while computing
    tp_size: int = 8  # tensor_parallel: GPUs of a node in one lock-step group
    microbatches: int = 8  # pipeline_1f1b
    stage_work: tuple[float, ...] = ()  # pipeline_1f1b: work factor of each stage
    moe_across_nodes: bool = True  # moe: all-to-all over InfiniBand (else inside a node)
    replica_gpus: int = 1  # async_replicas: GPUs serving one replica (1 or a node's)
    serving_memory_bound: float = 0.5  # async_replicas: decode's memory-bound share

    def memory_work(self, gpu: int) -> float:
        """The extra share of work GPU ``gpu`` of a node does in memory-bound kernels."""
        return self.memory_work_extra if gpu < self.memory_work_gpus else 0.0

    def stage_of(self, node_index: int) -> int:
        """Pipeline stage of a node (nodes are assigned round-robin, so DP replicas align)."""
        return node_index % max(1, min(self.stages, len(self.nodes)))

    @property
    def pipelined(self) -> bool:
        return self.kind in ("pipeline", "pipeline_1f1b")

    def stage_factor(self, node_index: int) -> float:
        """The work of a node's stage against the middle stages'."""
        stage, last = self.stage_of(node_index), min(self.stages, len(self.nodes)) - 1
        if self.kind == "pipeline_1f1b" and self.stage_work:
            return self.stage_work[stage % len(self.stage_work)]
        return 1.25 if stage == last else 1.05 if stage == 0 else 1.0

    def bubble(self) -> float:
        """A 1F1B step over the slowest stage's compute: ``(m + p - 1) / m``."""
        if self.kind != "pipeline_1f1b":
            return 1.0
        stages = max(1, min(self.stages, len(self.nodes)))
        return (self.microbatches + stages - 1) / max(1, self.microbatches)

    def exposed(self, comm: float) -> float:
        """The communication left after the barrier: what is not overlapped."""
        return comm * (1.0 - self.overlap) if self.kind in ("dp_overlap", "fsdp") else comm


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
    tick: float | None = None  # the agents' sample interval (None: the simulator's, 1 s)

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
    phases: GpuPhases
    speed: Speed
    nvlink_factor: float = 1.0
    throttle: int = 0
    hot: bool = False
    heat: float = 0.0  # thermal creep's progress, 0..1
    watts_scale: float = 1.0  # computing draw against the nominal (envelope)
    nominal_clock: float = 1.0  # the clock it would hold healthy (under the power cap)
    read_clock: float | None = None  # the capped clock at the read instant (envelope)
    link_compute: float = 0.0  # NVLink bytes while computing, as a share of NVLINK_PEAK
    origin: float | None = None  # its own step origin (async replicas), else the job's


class Simulator:
    """Generates samples tick by tick, deterministic per seed."""

    def __init__(self, cluster: Cluster, start: float, seed: int = 0,
                 tick: float | None = None) -> None:
        self.cluster = cluster
        self.start = start
        self.tick = tick if tick is not None else cluster.tick or 1.0
        self._rng = random.Random(seed)
        nodes = [n for job in cluster.jobs for n in job.nodes]
        self._skew = {n: self._rng.uniform(-1, 1) * cluster.skew_seconds for n in nodes}
        self._ecc: dict[tuple[str, str], float] = {}
        self._ib_errors: dict[str, float] = {}
        self._moe_hot: dict[str, tuple[str, str]] = {}
        self._moe_walk: dict[tuple[str, str, int], float] = {}  # GPU → log load share
        self._steps: dict[str, float] = {}  # job → steps done (for re-placements)
        self._origin: dict[str, tuple[float, float]] = {}  # job → (a step's start, period)
        # the newer physics draws from its own generator, so adding it left every
        # older scenario's samples exactly as they were
        self._physics = random.Random(f"{seed}-physics")
        self._drawn: dict[tuple[str, ...], float] = {}  # physics drawn once, then fixed
        # the envelope's draws (jobs with an ``envelope`` only) have a generator of their
        # own too: jobs without one make exactly the samples they made before
        self._env = random.Random(f"{seed}-envelope")
        self._last: dict[tuple[str, str], dict[str, float]] = {}  # for stale fields
        self._load: dict[tuple[str, str], tuple[float, float]] = {}  # replica → (level, burst)
        self._settled: dict[tuple[str, str], float] = {}  # GPU → the clock its cap last held
        # a capped clock's wander (envelope), from a generator of its own: adding it
        # left every other draw of every scenario as it was
        self._wander: dict[tuple[str, str, str], float] = {}
        self._wander_rng = random.Random(f"{seed}-clock-wander")
        # job → [(true time, actual step / healthy step)], one per tick: the ground
        # truth of what the job's faults cost (inf while it hangs)
        self.truth: dict[str, list[tuple[float, float]]] = {}
        # job → [(true time, healthy step / step with its work spread evenly)]: what
        # the job's own load imbalance costs it (1 for an even job)
        self.load_truth: dict[str, list[tuple[float, float]]] = {}
        self.step_timings: StepTimings | None = None  # attach to record per-rank steps

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
        if job.kind == "async_replicas":
            yield from self._async_tick(job, t)
            return
        rng = self._rng
        env = job.envelope
        faults = self._faults(job.name, t)
        kinds = {f.kind for f in faults}
        event = self._event(job, t)
        comm = job.comm_seconds * rng.gauss(1.0, 0.01)
        if job.kind in ("moe", "fsdp"):
            comm *= 1.5
        comm = job.exposed(comm)
        healthy_comm = comm
        if job.kind == "moe" and "network_phase" in kinds:
            comm *= 8.0 / 1.5
        if "nvlink_degraded" in kinds:
            comm *= 1.4
        if "nic_degraded" in kinds:
            comm *= 1.6
        if job.kind == "moe" and not (job.moe_rotation_seconds or job.moe_dwell_seconds
                                      or job.moe_walk_sigma or job.moe_fixed_hot) and (
                job.name not in self._moe_hot or rng.random() < 0.5):
            node = rng.choice(job.nodes)
            self._moe_hot[job.name] = (node, str(rng.randrange(job.gpus_per_node)))
        work: dict[tuple[str, str], float] = {}  # seconds of compute at nominal speed
        speeds: dict[tuple[str, str], Speed] = {}
        states: dict[tuple[str, str], _GpuState] = {}
        idle: dict[str, float] = {}  # node → seconds its GPUs wait for input each step
        gone = {n for n, at in job.leaves.items() if at <= t}
        for n, node in enumerate(job.nodes):
            if node in gone:
                continue
            stage_factor = job.stage_factor(n) if job.pipelined else 1.0
            idle[node] = sum((f.severity - 1.0) * job.compute_seconds for f in faults
                             if f.kind == "slow_host" and f.node == node and f.gpu is None)
            if env is not None:  # the host launching the step, the loader's hand-over
                idle[node] += env.host_gap * job.compute_seconds
            for g in range(job.gpus_per_node):
                key = (node, str(g))
                factor = stage_factor * self._workload_factor(job, t, n, g)
                if job.kind == "moe" and self._moe_hot.get(job.name) == key:
                    factor *= 1.2
                if event == "warmup":
                    factor *= rng.uniform(0.9, 1.1)
                factor *= 1.0 + job.memory_work(g)
                work[key] = job.compute_seconds * rng.gauss(1.0, 0.015) * factor
                speeds[key], states[key] = self._speed(job, node, g, faults, t)
        if env is not None and "hang" not in kinds:
            self._power_cap(job, env, work, speeds, states, idle, comm)
        compute = {k: work[k] * sp.stall / sp.clock for k, sp in speeds.items()}
        healthy = {k: work[k] * self._silicon(job, k) / states[k].nominal_clock for k in work}
        bubble = job.bubble()
        gap = env.host_gap * job.compute_seconds if env is not None else 0.0
        idle_of = {k: idle[k[0]] + rank_stall(job, faults, k) for k in compute}
        barrier = max(idle_of[k] + c for k, c in compute.items()) * bubble
        step = barrier + comm
        healthy_step = (gap + max(healthy.values())) * bubble + healthy_comm
        even = sum(work.values()) / len(work)
        even_step = (gap + max(even * self._silicon(job, k) / states[k].nominal_clock
                               for k in work)) * bubble + healthy_comm
        self.truth.setdefault(job.name, []).append(
            (t, math.inf if "hang" in kinds else step / healthy_step))
        self.load_truth.setdefault(job.name, []).append((t, healthy_step / even_step))
        link = self._link_compute(job)
        for key, st in states.items():
            st.phases = GpuPhases(idle_of[key], compute[key], barrier, comm)
            st.link_compute = link
        self._steps[job.name] = self._steps.get(job.name, 0.0) + self.tick / step
        origin = self._step_origin(job.name, t, step)
        if self.step_timings is not None:
            self.step_timings.observe(job, t, self.tick,
                                      {k: st.phases for k, st in states.items()}, faults, event)
        for node in job.nodes:
            if any(f.kind == "node_silent" and f.node == node for f in faults):
                continue
            if node in gone:  # left the job: idle, reporting under no job
                rest = GpuPhases(self.tick, 0.0, self.tick, 0.0)
                idle_states = {(node, str(g)): _GpuState(rest, Speed())
                               for g in range(job.gpus_per_node)}
                yield {**self._node_sample(job, node, t, idle_states, [], None, set(), origin),
                       "job": ""}
                continue
            yield self._node_sample(job, node, t, states, faults, event, kinds,
                                    origin + self._stage_lag(job, job.nodes.index(node),
                                                             barrier))

    @staticmethod
    def _stage_lag(job: JobSpec, node_index: int, barrier: float) -> float:
        """When a 1F1B stage starts its step's compute after the first stage: stage
        ``s`` waits ``s`` microbatch slots for its first activation (the fill bubble)
        and the last stage waits none at the end, so at every moment some stage
        computes; a step's bubbles are staggered over the stages, never a time when
        the whole job waits (Narayanan et al., PipeDream-Flush / Megatron 1F1B)."""
        if job.kind != "pipeline_1f1b":
            return 0.0
        stages = max(1, min(job.stages, len(job.nodes)))
        if stages < 2:
            return 0.0
        bubble_seconds = barrier * (1.0 - 1.0 / job.bubble())
        return job.stage_of(node_index) * bubble_seconds / (stages - 1)

    @staticmethod
    def _link_compute(job: JobSpec) -> float:
        """NVLink bytes a GPU moves while it computes, as a share of ``NVLINK_PEAK``:
        a tensor-parallel group's per-layer all-reduces, the overlapped share of a
        data-parallel or FSDP job's gradient traffic; nothing for the older kinds."""
        if job.kind == "tensor_parallel":
            return 0.35
        if job.kind in ("dp_overlap", "fsdp"):
            scale = 1.5 if job.kind == "fsdp" else 1.0
            return 0.5 * job.overlap * scale * job.comm_seconds / max(job.compute_seconds, 1e-9)
        return 0.0

    def _async_tick(self, job: JobSpec, t: float) -> Iterator[Sample]:
        """Independent serving replicas: no barrier, no collective. Each replica's
        load is its own: a level that wanders (log-normal, about a minute's memory)
        with bursts of requests that come and go; within a tick it serves requests
        of 20-200 ms, running a kernel for its load's share of each and none between
        (so ``gpu_util`` follows the load). A replica of a whole node moves its GPUs
        together (tensor parallel inside the node), over NVLink."""
        physics, env = self._physics, job.envelope
        faults = self._faults(job.name, t)
        states: dict[tuple[str, str], _GpuState] = {}
        group = max(1, min(job.replica_gpus, job.gpus_per_node))
        origins: dict[tuple[str, str], float] = {}  # replica → where its request began
        for node in job.nodes:
            for g in range(job.gpus_per_node):
                replica = (node, str(g - g % group))
                if g % group == 0:  # the replica's load this tick, once for its GPUs
                    level, burst = self._load.get(replica, (physics.gauss(-0.6, 0.4), 0.0))
                    a = min(1.0, self.tick / 60.0)
                    level += -a * (level + 0.6) + 0.4 * math.sqrt(2 * a) * physics.gauss(0, 1)
                    if burst > 0:
                        burst = max(0.0, burst - self.tick)
                    elif physics.random() < min(1.0, 0.01 * self.tick):
                        burst = physics.uniform(5.0, 60.0)
                    self._load[replica] = (level, burst)
                level, burst = self._load[replica]
                load = _clip(math.exp(level) * (1.8 if burst > 0 else 1.0), 0.02, 0.97)
                request = self._draw((job.name, *replica, "request"),
                                     lambda: physics.uniform(0.02, 0.2))
                speed, st = self._speed(job, node, g, faults, t)
                st.speed = Speed(speed.clock, speed.mem_clock, speed.stall, speed.intensity,
                                 job.serving_memory_bound)
                busy = request * load
                st.phases = GpuPhases(request - busy, busy, request, 0.0)
                if replica not in origins:
                    origins[replica] = t - physics.uniform(0.0, request)
                st.origin = origins[replica]
                st.link_compute = 0.15 if group > 1 else 0.0
                if env is not None:
                    st.watts_scale = self._draw(
                        (job.name, node, str(g), "leak"), lambda: max(0.8, self._env.gauss(
                            1.0, env.silicon_sigma))) * (env.compute_watts - IDLE_WATTS) / (
                                NOMINAL_COMPUTING_WATTS)
                    sp, scale = st.speed, st.watts_scale

                    def draw(c: float, sp: Speed = sp, scale: float = scale) -> float:
                        return IDLE_WATTS + computing_watts(
                            Speed(c, sp.mem_clock, sp.stall, sp.intensity,
                                  sp.memory_bound), scale)

                    # served in bursts: held on its kernels' draw, the same every tick
                    # while its speed is
                    cap_key = (job.name, node, str(g), "cap", str(sp.clock), str(sp.stall))
                    if cap_key not in self._drawn:
                        self._drawn[cap_key] = capped_clock(draw, env.power_limit, sp.clock)
                    clock = self._drawn[cap_key]
                    if clock < sp.clock:
                        st.speed = Speed(clock, sp.mem_clock, sp.stall, sp.intensity,
                                         sp.memory_bound)
                        st.throttle |= THROTTLE_SW_POWER_CAP
                states[(node, str(g))] = st
        self.truth.setdefault(job.name, []).append((t, 1.0))
        self.load_truth.setdefault(job.name, []).append((t, 1.0))
        event = self._event(job, t)
        for node in job.nodes:
            if any(f.kind == "node_silent" and f.node == node for f in faults):
                continue
            yield self._node_sample(job, node, t, states, faults, event, set(), t)

    def _step_origin(self, job: str, t: float, period: float) -> float:
        """A time at which one of the job's steps began, for steps of ``period``: the
        step in progress at the last tick keeps its progress when the period
        changes (a fault lengthens the steps from here on, it does not jump)."""
        before = self._origin.get(job)
        if before is None:
            origin = t - self._physics.uniform(0.0, period)
        else:
            old_origin, old_period = before
            done = ((t - self.tick - old_origin) % old_period) / old_period
            origin = t - self.tick - done * period
        self._origin[job] = (origin, period)
        return origin

    def _speed(self, job: JobSpec, node: str, g: int, faults: list[Fault],
               t: float) -> tuple[Speed, _GpuState]:
        """A GPU's speed under the faults that touch it, and its state for readings."""
        gpu = str(g)
        clock, stall = 1.0, self._silicon(job, (node, gpu))
        st = _GpuState(GpuPhases(0.0, 0.0, 0.0, 0.0), Speed())
        for f in faults:
            if f.node != node:
                continue
            mine = f.gpu == gpu
            if f.kind == "slow_gpu_quiet" and mine:
                stall *= f.severity  # a stall: no clock change, no flag
            elif f.kind == "thermal_creep" and mine:
                heat = min(1.0, (t - f.start) / CREEP_SECONDS)
                slow = 1.0 + (f.severity - 1.0) * heat
                clock /= slow
                st.heat = heat
                if heat >= 0.5 and job.envelope is not None:
                    # the driver's SW thermal slowdown first, the hardware's at full heat
                    st.throttle |= THROTTLE_SW_THERMAL | (THROTTLE_HW_THERMAL if heat >= 1.0
                                                          else 0)
                elif heat >= 0.5:
                    st.throttle |= THROTTLE_HW_THERMAL
            elif f.kind == "slow_node" or (f.kind == "slow_gpu" and mine):
                clock /= f.severity
                # a slowdown the driver reports: HW slowdown where the power cap is
                # the healthy state (the envelope); the older suites' 0x4 otherwise
                st.throttle |= (THROTTLE_HW_SLOWDOWN if job.envelope is not None
                                else THROTTLE_SW_POWER_CAP)
            elif f.kind == "power_brake":
                clock /= f.severity
                st.throttle |= THROTTLE_HW_POWER_BRAKE
            elif f.kind == "thermal" and mine:
                clock /= 1.25
                st.throttle |= THROTTLE_HW_THERMAL
                st.hot = True
            elif f.kind == "nvlink_degraded" and mine:
                st.nvlink_factor = 0.55
        intensity = self._draw((job.name, node, gpu, "intensity"),
                               lambda: self._physics.gauss(1.0, 0.01))
        extra = job.memory_work(g)
        st.speed = Speed(clock=clock, stall=stall, intensity=intensity,
                         memory_bound=extra / (1.0 + extra))
        return st.speed, st

    def _power_cap(self, job: JobSpec, env: Envelope, work: dict[tuple[str, str], float],
                   speeds: dict[tuple[str, str], Speed],
                   states: dict[tuple[str, str], _GpuState], idle: dict[str, float],
                   comm: float) -> None:
        """DVFS at the board's power limit: each GPU's clock is lowered until its draw
        fits ``env.power_limit``, and 0x4 (SW power cap) is set while it is. The driver
        holds the draw over about ``POWER_CONTROL_SECONDS``: a step shorter than that
        is held on its mean (a GPU that computes more of the step, a hot expert, draws
        more and runs a lower clock than its peers), a longer one on its computing
        phase. The others' barrier is taken at their uncapped clocks (one pass)."""
        ends = sorted(((idle[k[0]] + work[k] * sp.stall / sp.clock, k)
                       for k, sp in speeds.items()), reverse=True)
        first, first_key = ends[0]
        second = ends[1][0] if len(ends) > 1 else 0.0
        bubble = job.bubble()
        for key, sp in speeds.items():
            st = states[key]
            st.watts_scale = self._draw(
                (job.name, *key, "leak"), lambda: max(0.8, self._env.gauss(
                    1.0, env.silicon_sigma))) * (env.compute_watts - IDLE_WATTS) / (
                        NOMINAL_COMPUTING_WATTS)
            others = second if key == first_key else first
            demand, waits = work[key] * sp.stall, idle[key[0]]

            def draw(c: float, sp: Speed = sp, scale: float = st.watts_scale,
                     demand: float = demand, others: float = others,
                     waits: float = waits) -> float:
                burn = IDLE_WATTS + computing_watts(
                    Speed(c, sp.mem_clock, sp.stall, sp.intensity, sp.memory_bound), scale)
                busy = demand / c
                barrier = max(others, waits + busy) * bubble
                step = barrier + comm
                mean = (waits * IDLE_WATTS + busy * burn
                        + (barrier - waits - busy) * (IDLE_WATTS + WAITING_WATTS)
                        + comm * (IDLE_WATTS + COMMUNICATING_WATTS)) / step
                held = min(1.0, POWER_CONTROL_SECONDS / step)
                return held * mean + (1.0 - held) * burn

            settled = self._settled.get(key)
            clock = capped_clock(draw, env.power_limit, sp.clock, near=settled)
            self._settled[key] = clock
            st.nominal_clock = clock if sp.clock >= 1.0 else capped_clock(
                draw, env.power_limit, 1.0)
            wander = self._clock_wander((job.name, *key), env.clock_jitter)
            if clock < sp.clock - 1e-6:
                st.throttle |= THROTTLE_SW_POWER_CAP
                # the clock wanders at constant power: the tick's mean moves by less
                # than the read instant's once the tick spans several time constants
                st.read_clock = min(sp.clock, clock * (1.0 + wander))
                moved = min(sp.clock, clock * (1.0 + wander * min(
                    1.0, math.sqrt(2.0 * CLOCK_WANDER_SECONDS / self.tick))))
                st.nominal_clock = min(1.0, st.nominal_clock * moved / clock)
                st.watts_scale *= (clock / moved) ** 2
                clock = moved
                speeds[key] = st.speed = Speed(clock, sp.mem_clock, sp.stall, sp.intensity,
                                               sp.memory_bound)

    def _clock_wander(self, key: tuple[str, str, str], sigma: float) -> float:
        """A GPU's capped clock over its cap's settled value, less 1: an
        Ornstein-Uhlenbeck wander of σ ``sigma`` and time constant
        ``CLOCK_WANDER_SECONDS``, stepped once a tick whether the cap binds or not."""
        rng = self._wander_rng
        level = self._wander.get(key)
        if level is None:
            level = rng.gauss(0.0, sigma)
        else:
            keep = math.exp(-self.tick / CLOCK_WANDER_SECONDS)
            level = keep * level + sigma * math.sqrt(1.0 - keep * keep) * rng.gauss(0.0, 1.0)
        self._wander[key] = level
        return level

    def _silicon(self, job: JobSpec, key: tuple[str, str]) -> float:
        """A GPU's static time per unit of work (silicon, cooling): 1 ± the job's
        heterogeneity."""
        if not job.heterogeneity:
            return 1.0
        return self._draw((job.name, *key, "spread"), lambda: max(
            0.8, self._physics.gauss(1.0, job.heterogeneity)))

    def _workload_factor(self, job: JobSpec, t: float, node_index: int, gpu: int) -> float:
        """A GPU's share of the step's work, against an even share: MoE expert load
        that wanders, jumps when experts are re-placed, stays hot for good, rotates
        smoothly or dwells on one GPU at a time; per-step token noise."""
        factor = 1.0
        if job.kind != "moe":
            return factor
        node, physics = job.nodes[node_index], self._physics
        if job.moe_rotation_seconds:
            phase = self._draw((job.name, node, str(gpu), "phase"), physics.random)
            factor *= 1.0 + job.moe_amplitude * math.cos(
                2 * math.pi * ((t - self.start) / job.moe_rotation_seconds - phase))
        if job.moe_dwell_seconds:
            turn = int((t - self.start) // job.moe_dwell_seconds)
            hot = self._draw((job.name, str(turn), "hot"), lambda: float(
                physics.randrange(len(job.nodes) * job.gpus_per_node)))
            if hot == node_index * job.gpus_per_node + gpu:
                factor *= 1.0 + job.moe_amplitude
        if job.moe_fixed_hot:
            index = node_index * job.gpus_per_node + gpu
            hot_ones = self._draw((job.name, "fixed-hot"), lambda: float(
                physics.randrange(len(job.nodes) * job.gpus_per_node)))
            if (index - int(hot_ones)) % (len(job.nodes) * job.gpus_per_node) < job.moe_fixed_hot:
                factor *= 1.0 + job.moe_amplitude
        if job.moe_walk_sigma:
            factor *= math.exp(self._walk(job, node, gpu))
            factor *= max(0.5, physics.gauss(1.0, job.moe_step_noise))
        return factor

    def _walk(self, job: JobSpec, node: str, gpu: int) -> float:
        """A GPU's persistent log load share: an Ornstein-Uhlenbeck walk with the
        job's σ and time constant (in steps), redrawn when experts are re-placed."""
        key, physics = (job.name, node, gpu), self._physics
        sigma, steps = job.moe_walk_sigma, self._steps.get(job.name, 0.0)
        level = self._moe_walk.get(key)
        replaced = job.moe_replace_steps and level is not None and int(
            steps // job.moe_replace_steps) != int(self._moe_walk.get((job.name, "", -1), 0.0))
        if level is None or replaced:
            level = physics.gauss(0.0, sigma)
        else:
            a = min(1.0, (self.tick / max(job.compute_seconds, 1e-3)) / job.moe_walk_steps)
            level += -a * level + sigma * math.sqrt(2 * a) * physics.gauss(0.0, 1.0)
        self._moe_walk[key] = level
        if job.moe_replace_steps and gpu == job.gpus_per_node - 1 and node == job.nodes[-1]:
            self._moe_walk[(job.name, "", -1)] = float(int(steps // job.moe_replace_steps))
        return level

    def _draw(self, key: tuple[str, ...], draw: Callable[[], float]) -> float:
        """A physics value drawn the first time ``key`` is asked for, then fixed (a
        GPU's spread, its experts' phase, where the hot expert sits in a turn)."""
        if key not in self._drawn:
            self._drawn[key] = draw()
        return self._drawn[key]

    def _node_sample(self, job: JobSpec, node: str, t: float,
                     states: dict[tuple[str, str], _GpuState], faults: list[Fault],
                     event: str | None, kinds: set[str], origin: float) -> Sample:
        rng, env = self._rng, job.envelope
        window = self._window(node, t)
        late = 0.0
        if env is not None:  # the agent read a little late or early: all its GPUs alike
            late = max(-0.45, min(0.45, self._env.gauss(0.0, env.tick_jitter))) * self.tick
            window = (window[0] + late, window[1] + late)
        gpus: dict[str, dict[str, float]] = {}
        for g in range(job.gpus_per_node):
            gpu = str(g)
            mine = [f for f in faults if f.node == node and f.gpu == gpu]
            if any(f.kind == "gpu_lost" and t >= f.start + 1 for f in mine):
                continue  # fell off the bus: no reading at all
            st = states[(node, gpu)]
            reading = self._gpu_reading(st, event, "hang" in kinds, window,
                                        origin if st.origin is None else st.origin)
            if env is not None:
                self._envelope_reading(job, env, (node, gpu), st, reading, window,
                                       origin if st.origin is None else st.origin,
                                       "hang" in kinds, event)
            for f in mine:
                self._apply_gpu_fault(f, reading, t, (node, gpu))
            reading["ecc_dbe"] = self._ecc.get((node, gpu), 0.0)
            gpus[gpu] = reading
        nic_degraded = any(f.kind == "nic_degraded" and f.node == node for f in faults)
        first = states.get((node, "0"))
        shares = phase_shares(first.phases, *window, origin) if (
            first is not None and first.phases.period > 0) else (0.0, 0.0, 0.0, 0.0)
        comm_share = shares[3]
        if job.kind == "pipeline_1f1b":  # activations to the next stage while computing
            comm_share += 0.2 * shares[1]
        elif job.kind == "async_replicas":  # requests in, responses out: a trickle
            comm_share = 0.02
        elif job.kind in ("dp_overlap", "fsdp"):
            comm_share += shares[1] * job.overlap * job.comm_seconds / max(
                job.compute_seconds, 1e-9)
        nics = {}
        for k in range(2 if env is None else env.nics):
            name = f"mlx5_{k}"
            moving = 0.0 if ("hang" in kinds or event in ("checkpoint", "eval")) else comm_share
            util = (0.15 if job.kind == "moe" and not job.moe_across_nodes
                    else 0.7 if job.kind == "moe" else 0.5)
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
            "schema": SAMPLE_SCHEMA, "ts": round(t + late + self._clock(node, t), 3),
            "job": job.name, "node": node, "gpus": gpus,
            "host": {"cpu_util": self._cpu_util(node, faults), "mem_used": 400 * GIB},
            "nics": nics,
            "meta": {"agent": "vigil-simulator", "gpu_model": "H100-SXM", "sm_count": 132},
        }

    def _envelope_reading(self, job: JobSpec, env: Envelope, key: tuple[str, str],
                          st: _GpuState, reading: dict[str, float],
                          window: tuple[float, float], origin: float, hung: bool,
                          event: str | None) -> None:
        """What the envelope changes in a reading: the SMs a waiting GPU holds (one per
        NCCL channel), NVML's last-period integer utilisation, the slot's temperature,
        a hang's silent links, DCGM profiling fields left stale for a tick."""
        rng = self._env
        period = st.phases.period
        if hung:
            shares = (0.0, 0.0, 1.0, 0.0)
        elif period > 0:
            shares = phase_shares(st.phases, *window, origin)
        else:
            shares = (1.0, 0.0, 0.0, 0.0)
        wait = shares[2]
        # the spinning CTAs' SMs: counters() counted one, a channel each is held
        extra = wait * (env.waiting_sm - SM_WHILE_WAITING)
        reading["sm_active"] = _clip(reading["sm_active"] + extra)
        reading["sm_occupancy"] = _clip(reading["sm_occupancy"]
                                       + extra * OCCUPANCY_PER_SPINNING_CTA * SM_COUNT)
        if hung:
            reading["pcie_tx"] = abs(rng.gauss(2e6, 5e5))  # nothing moves; a trickle
            reading["pcie_rx"] = abs(rng.gauss(2e6, 5e5))
        if event in (None, "warmup"):  # training steps (not a checkpoint's or eval's)
            end = window[1]
            last = (phase_shares(st.phases, end - env.util_period, end, origin)
                    if period > 0 and not hung else (0.0, 0.0, 1.0, 0.0))
            reading["gpu_util"] = math.floor(100.0 * (1.0 - last[0]) + 1e-9) / 100.0
        # the clock as NVML reports it: an instant, in 15 MHz steps (this replaces the
        # older suites' ±5 MHz noise, whose draw is kept so every other draw stays put)
        clock = st.read_clock if st.read_clock is not None else st.speed.clock
        reading["sm_clock"] = SM_CLOCK_STEP * round(NOMINAL_SM_CLOCK * clock / SM_CLOCK_STEP)
        reading["temperature"] += self._draw(
            (job.name, *key, "slot"), lambda: self._env.gauss(0.0, env.temp_sigma))
        before = self._last.get(key)
        if before is not None and rng.random() < env.stale_rate:
            reading.update(before)  # the watch had no new value: the last one again
        self._last[key] = {f: reading[f] for f in STALE_FIELDS}

    def _window(self, node: str, t: float) -> tuple[float, float]:
        """The true times the node's agent averaged its sample of tick ``t`` over:
        one tick, at the node's own phase."""
        phase = self._draw(("window-phase", node), self._physics.random)
        end = t - phase * self.tick
        return end - self.tick, end

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

    def _gpu_reading(self, st: _GpuState, event: str | None, hung: bool,
                     window: tuple[float, float], origin: float) -> dict[str, float]:
        rng = self._rng
        period = st.phases.period
        shares = (phase_shares(st.phases, *window, origin) if period > 0
                  else (1.0, 0.0, 0.0, 0.0))
        if hung:  # a spinning NCCL kernel: 100% "utilisation", 1/132 of the SMs
            shares = (0.0, 0.0, 1.0, 0.0)
        values = counters(shares, st.speed, rng.gauss(1.0, 0.01), watts_scale=st.watts_scale)
        nvlink = (shares[3] * 0.5 + shares[1] * st.link_compute) * NVLINK_PEAK * st.nvlink_factor
        pcie_tx, pcie_gen = abs(rng.gauss(1.2e9, 1e8)), 5.0
        if event == "checkpoint":
            values.update(sm_active=0.01, sm_occupancy=0.0, tensor_active=0.0, fp16_active=0.0,
                          fp32_active=0.0, dram_active=0.05, gpu_util=0.05, power=110.0)
            nvlink, pcie_tx = 0.0, abs(rng.gauss(12e9, 5e8))
        elif event == "eval":  # forward passes only, no gradient exchange
            values = counters((0.2, 0.3, 0.5, 0.0), st.speed, rng.gauss(1.0, 0.01),
                              watts_scale=st.watts_scale)
            nvlink = 0.0
            pcie_gen = 1.0 if rng.random() < 0.3 else 5.0  # idle power saving
        for name in ("sm_active", "sm_occupancy", "tensor_active", "fp16_active",
                     "fp32_active", "dram_active"):
            values[name] = _clip(values[name] + rng.gauss(0.0, 0.003))
        values["gpu_util"] = _clip(values["gpu_util"] + rng.gauss(0.0, 0.002))
        power = max(60.0, rng.gauss(values["power"], 4.0))
        busy = values["sm_active"]
        return {
            **values,
            "power": power,
            "temperature": rng.gauss(90.0 if st.hot else 40 + 0.06 * power + 30 * st.heat
                                     + 2 * busy, 0.8),
            "sm_clock": round(NOMINAL_SM_CLOCK * st.speed.clock + rng.gauss(0, 5)),
            "mem_clock": round(NOMINAL_MEM_CLOCK * st.speed.mem_clock),
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
