"""A healthy fleet for the false-alarm soak (issue #14): jobs of every kind and size
that nobody faults, with the life a real fleet has (warm-up, checkpoints,
evaluations, steps of 0.3 s to 30 s, MoE load that moves, wanders, jumps when
experts are re-placed or stays hot for good, static GPU differences, GPUs with more
memory-bound work than their peers, a lossy node, skewed and drifting clocks). Every
detection that fires on it is a false alarm, except ``load_imbalance``: that reports
workload, and is counted apart.

With ``envelope=True`` (issue #45) every job also draws its physics envelope
(``simulator/envelope.py``: NCCL channels, NVML's utilisation period, the power limit
and the clock held under it, silicon and slot spread, the agent's tick, jitter, skew
and loss, stale fields, NICs, the host's gap in each step) and the kinds widen to
every kind the simulator has: overlapped data parallel, FSDP, tensor parallel, 1F1B
pipelines, MoE inside a node, and asynchronous serving replicas (a replica per GPU or
per node). Each job's size is drawn first, and its kind is the one furthest behind
an even share of the GPU-hours so far: of the 13 kinds, MoE holds 5/13 (38 %) and
serving 2/13 (15 %) of any prefix of the plan, within one job's GPU-hours.

The rate is reported per 1,000 GPU-days with its one-sided 95 % Poisson upper bound:
zero alarms in E GPU-days bounds the rate below ``3.0 / E`` (``-ln 0.05``).
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from vigil_gpu_monitor.simulator.cluster import Cluster, Event, JobSpec
from vigil_gpu_monitor.simulator.envelope import draw

SIZES = (2, 4, 8, 16, 32, 64)
KINDS = ("data_parallel", "pipeline", "moe_classic", "moe_rotating", "moe_dwell",
         "moe_persistent")
STEP_SECONDS = (0.3, 1.0, 1.0, 3.0, 10.0, 30.0)  # compute + communication of one step
ENVELOPE_KINDS = ("data_parallel", "moe_classic", "dp_overlap", "moe_rotating", "fsdp",
                  "async_gpu", "tensor_parallel", "moe_dwell", "pipeline", "pipeline_1f1b",
                  "moe_persistent", "async_node", "moe_intra")


@dataclass(frozen=True)
class FleetJob:
    """One healthy job of the soak: its cluster and how long it runs."""

    name: str
    cluster: Cluster
    seconds: float

    @property
    def gpu_hours(self) -> float:
        job = self.cluster.jobs[0]
        return len(job.nodes) * job.gpus_per_node * self.seconds / 3600.0


def _events(start: float, seconds: float, rng: random.Random) -> list[Event]:
    """Warm-up, then a checkpoint every 8-15 minutes and an evaluation every 20-40."""
    events = [Event("warmup", start, start + rng.uniform(20, 60))]
    t = start + rng.uniform(300, 900)
    while t < start + seconds:
        events.append(Event("checkpoint", t, t + rng.uniform(10, 40)))
        t += rng.uniform(480, 900)
    t = start + rng.uniform(900, 2400)
    while t < start + seconds:
        events.append(Event("eval", t, t + rng.uniform(30, 120)))
        t += rng.uniform(1200, 2400)
    return sorted(events, key=lambda e: e.start)


def fleet_job(index: int, start: float, seconds: float, seed: int,
              envelope: bool = False) -> FleetJob:
    """The ``index``-th job of the fleet: kind, size and impairments drawn from
    ``seed`` and ``index`` (the same job every time); with ``envelope``, its physics
    envelope too, from every kind the simulator has."""
    if envelope:
        return _envelope_job(index, start, seconds, seed)
    rng = random.Random(f"fleet-{seed}-{index}")
    kind = KINDS[index % len(KINDS)]
    nodes = rng.choice(SIZES)
    name = f"fleet-{seed}-{index:04d}-{kind}-{nodes}n"
    step = rng.choice(STEP_SECONDS)
    spec: dict[str, object] = {"heterogeneity": rng.choice((0.0, 0.01, 0.03)),
                               "compute_seconds": 0.8 * step, "comm_seconds": 0.2 * step}
    if kind.startswith("moe"):
        # compute- or network-bound
        spec["comm_seconds"] = rng.choice((0.2, 0.8)) * step
        spec.update(_moe_load(kind, kind == "moe_persistent", rng))
    job = JobSpec(name, [f"{name}-n{i:03d}" for i in range(nodes)],
                  kind="moe" if kind.startswith("moe") else kind,
                  events=_events(start, seconds, rng), **spec)  # type: ignore[arg-type]
    impairments = _impairments(job.nodes, rng)
    # drawn last, so that every other draw of a job is what it was before this was
    # added: embedding or optimizer shards left uneven on one or two GPUs a node
    if not kind.startswith("moe") and rng.random() < 0.3:
        job.memory_work_gpus = rng.choice((1, 2))
        job.memory_work_extra = rng.uniform(0.10, 0.30)
    cluster = Cluster([job], skew_seconds=3.0, loss=0.01, reorder_seconds=2.0,
                      **impairments)  # type: ignore[arg-type]
    return FleetJob(name, cluster, seconds)


def _size(index: int, seed: int) -> int:
    return random.Random(f"fleet-envelope-{seed}-{index}-size").choice(SIZES)


@functools.lru_cache(maxsize=8)
def _kinds(seed: int, count: int) -> tuple[str, ...]:
    """The kinds of the first ``count`` envelope jobs: each the kind furthest behind
    an even share of the GPU-hours (node counts: every job runs as long)."""
    hours = dict.fromkeys(ENVELOPE_KINDS, 0.0)
    out = []
    for index in range(count):
        nodes = _size(index, seed)
        total = sum(hours.values()) + nodes
        kind = max(ENVELOPE_KINDS, key=lambda k: total / len(ENVELOPE_KINDS) - hours[k])
        hours[kind] += nodes
        out.append(kind)
    return tuple(out)


def _impairments(nodes: list[str], rng: random.Random) -> dict[str, object]:
    """A fleet job's message-path impairments: a lossy node, and on three nodes or
    more a clock set off by 30 s and one drifting."""
    out: dict[str, object] = {}
    if rng.random() < 0.3:
        out["node_loss"] = {rng.choice(nodes): 0.4}
    if len(nodes) >= 3 and rng.random() < 0.3:
        ahead, drifting = rng.sample(nodes, 2)
        out["offsets"] = {ahead: rng.choice((-30.0, 30.0))}
        out["drift"] = {drifting: rng.uniform(-60, 60)}
    return out


def _moe_load(kind: str, persistent: bool, rng: random.Random) -> dict[str, object]:
    """How an MoE fleet job's expert load moves: a persistent share that wanders,
    jumps and stays hot, rotating, or dwelling (drawn in this order: the fleets'
    jobs are the same every time)."""
    if persistent:
        return {"moe_walk_sigma": rng.uniform(0.05, 0.15),
                "moe_walk_steps": rng.uniform(200, 2000),
                "moe_replace_steps": rng.uniform(1000, 3000),
                "moe_fixed_hot": rng.choice((0, 1, 2)),
                "moe_amplitude": rng.uniform(0.2, 0.5)}
    if kind == "moe_rotating":
        return {"moe_rotation_seconds": rng.uniform(60, 180)}
    if kind == "moe_dwell":
        return {"moe_dwell_seconds": rng.uniform(60, 180)}
    return {}


def _envelope_job(index: int, start: float, seconds: float, seed: int) -> FleetJob:
    """A fleet job over the envelope (see the module docstring)."""
    rng = random.Random(f"fleet-envelope-{seed}-{index}")
    env = draw(random.Random(f"fleet-envelope-{seed}-{index}-physics"))
    kind = _kinds(seed, (index // 256 + 1) * 256)[index]
    nodes = _size(index, seed)
    name = f"fleet-{seed}-{index:04d}-{kind.replace('_', '')}-{nodes}n"
    step = rng.choice(STEP_SECONDS)
    spec: dict[str, object] = {"heterogeneity": rng.choice((0.0, 0.01, 0.03)),
                               "compute_seconds": 0.8 * step, "comm_seconds": 0.2 * step}
    job_kind = "moe" if kind.startswith("moe") else (
        "async_replicas" if kind.startswith("async") else kind)
    if job_kind == "moe":
        spec.update(comm_seconds=rng.choice((0.2, 0.8)) * step,
                    moe_across_nodes=kind != "moe_intra")
        spec.update(_moe_load(kind, kind in ("moe_persistent", "moe_intra"), rng))
    elif kind in ("dp_overlap", "fsdp"):
        spec["overlap"] = rng.uniform(0.5, 0.9)
    elif kind == "tensor_parallel":
        spec["tp_size"] = rng.choice((2, 4, 8))
    elif kind == "pipeline_1f1b":
        spec.update(stages=rng.choice((2, 4, 8)), microbatches=rng.choice((4, 8, 16, 32)),
                    stage_work=(rng.uniform(1.05, 1.15), 1.0, 1.0, rng.uniform(1.1, 1.3)))
    elif job_kind == "async_replicas":
        spec = {"replica_gpus": 1 if kind == "async_gpu" else 8,
                "serving_memory_bound": rng.uniform(0.3, 0.7)}
    if job_kind in ("data_parallel", "pipeline", "pipeline_1f1b") and rng.random() < 0.3:
        spec.update(memory_work_gpus=rng.choice((1, 2)),
                    memory_work_extra=rng.uniform(0.10, 0.30))
    events = [] if job_kind == "async_replicas" else _events(start, seconds, rng)
    job = JobSpec(name, [f"{name}-n{i:03d}" for i in range(nodes)], kind=job_kind,
                  events=events, envelope=env, **spec)  # type: ignore[arg-type]
    impairments = _impairments(job.nodes, rng)
    cluster = Cluster([job], skew_seconds=env.clock_skew, loss=env.loss, reorder_seconds=2.0,
                      tick=env.tick, **impairments)  # type: ignore[arg-type]
    return FleetJob(name, cluster, seconds)


def kind_of(job: FleetJob) -> str:
    """The fleet kind a job was drawn as (its name's fourth part)."""
    return job.name.split("-")[3]


def poisson_upper(observed: int, confidence: float = 0.95) -> float:
    """One-sided upper confidence bound of a Poisson mean, having seen ``observed``
    events: the mean at which seeing that few has probability ``1 − confidence``."""
    def cdf(mean: float) -> float:
        term = total = math.exp(-mean)
        for k in range(1, observed + 1):
            term *= mean / k
            total += term
        return total

    low, high = 0.0, max(1.0, 2.0 * observed + 10.0)
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) > 1 - confidence else (low, mid)
    return high
