"""Held-out job physics: the classes the detectors were not designed around.

Issue #14 asks for an honest evaluation *before* tuning: job physics the detectors
never saw, and seeds split into a tuning set and a held-out set that nobody looks at
while tuning. Each class is one job:

Healthy look-alikes (nothing may fire):
- ``moe_rotating`` / ``moe_rotating_net``: MoE expert load rotating smoothly between
  GPUs (±20 %, one turn in 1–3 min, each GPU at its own phase), compute-bound and
  network-bound;
- ``moe_hot_dwell`` / ``moe_hot_dwell_net``: one hot expert (+20 %) that stays on a
  GPU for 1–3 min, then moves to another;
- ``heterogeneous``: static per-GPU compute spread (σ 3 %: silicon, cooling);
- ``shrinking``: a quarter of the nodes leave the job and report under no job;
- ``lossy_node``: one node loses 40 % of its messages for the whole run;
- ``clock_offset``: one node's clock 30 s ahead, another drifting 60 s an hour;
- ``moe_persistent`` / ``moe_persistent_net`` (issue #28): MoE load as published
  measurements have it: a per-GPU share that wanders (σ 5–15 %, time constant 200–
  2,000 steps), jumps when experts are re-placed (every 1,000–3,000 steps), per-step
  token noise, and one GPU whose experts stay hot for good (+20–50 %);
- ``steps_short`` / ``steps_long``: steps of 0.3 s and 30 s (a one-second reading
  beats with a long step);
- ``memory_work``: one GPU of each node does 15–30 % more work, all of it in
  memory-bound kernels (an uneven embedding or optimizer shard): busier, with its
  tensor work level and its DRAM traffic up.

Faults (each must be found, on the right GPU or node):
- ``quiet_12`` / ``quiet_25``: a GPU 12 % / 25 % slower with no clock or flag change;
- ``slow_40``: a GPU 40 % slower (with the clock and power-cap flag of ``slow_gpu``);
- ``slow_host``: a node whose host (CPU, data loader) slows all its GPUs by 25 %;
- ``thermal_creep``: a GPU slowing to 30 % over 10 minutes;
- ``quiet_5``: 5 % slower, no signature (the stretch goal: found within 15 min);
- ``degraded_at_start``: a GPU already 30 % slow when Vigil first sees the job;
- ``moe_stall_15`` / ``moe_throttled`` (issue #28): a 15 % stall, or a GPU throttled
  25 %, in a ``moe_persistent`` job (found within 3 min and 10 s);
- ``quiet_25_long_steps``: a 25 % stall in a job of 10 s steps.

``slow_host`` is found as the job's ``slowdown`` naming the node (its GPUs wait
idle: no GPU is busier than its peers).

``TUNING_SEEDS`` may be looked at while tuning; ``HELD_OUT_SEEDS`` may not.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from vigil_gpu_monitor.simulator.cluster import Cluster, Event, Fault, JobSpec
from vigil_gpu_monitor.vigil.evaluation.scenarios import Scenario

START = 1_820_000_000.0
FAULT_AT = 180.0
# Seeds 1 and 2 were looked at while the detectors were tuned; 11-13 were the first
# held-out set, but one constant was chosen looking at them; 21-23 were the second,
# and one change (how load shed is told) followed their first run; 31-33 were the
# third, and one change (the phase gate, for false alarms the fleet soak found)
# followed theirs; 41-43 the fourth, and two more fixes the soak asked for followed
# (a GPU's silence on its node's clock, the median GPU in the phase gate). All of
# those count as tuning seeds now. 51-53 were first run for bench/RESULTS.md.
# Issue #28 rewrote the simulator's counters: 51-53 had been looked at, so the held-out
# set for the new physics is 61-63, first run for bench/RESULTS.md.
TUNING_SEEDS = (1, 2, 11, 12, 13, 21, 22, 23, 31, 32, 33, 41, 42, 43, 51, 52, 53)
HELD_OUT_SEEDS = (61, 62, 63)
SIZES = (4, 16)


@dataclass(frozen=True)
class PhysicsClass:
    """One class: how to build its job and fault, and how long to watch."""

    name: str
    build: Callable[[str, int, random.Random], tuple[JobSpec, list[Fault], dict[str, object]]]
    duration: float = 480.0
    effect: str = ""  # the effect-size band a fault belongs to (25 %+, 10–12 %, 5 %)


def _events() -> list[Event]:
    return [Event("warmup", START, START + 40), Event("checkpoint", START + 90, START + 105)]


def _job(name: str, nodes: int, kind: str = "data_parallel", **kw: object) -> JobSpec:
    return JobSpec(name, [f"node-{i:03d}" for i in range(nodes)], kind=kind,
                   events=_events(), **kw)  # type: ignore[arg-type]


def _gpu_fault(kind: str, severity: float, at: float = START + FAULT_AT
               ) -> Callable[[str, int, random.Random], tuple[JobSpec, list[Fault],
                                                                dict[str, object]]]:
    def build(name: str, nodes: int, rng: random.Random
              ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
        job = _job(name, nodes)
        node, gpu = rng.choice(job.nodes), str(rng.randrange(job.gpus_per_node))
        if kind == "slow_host":
            return job, [Fault(kind, name, node, None, at, severity=severity)], {}
        return job, [Fault(kind, name, node, gpu, at, severity=severity)], {}
    return build


def _moe(network: bool, dwell: bool = False
         ) -> Callable[[str, int, random.Random],
                       tuple[JobSpec, list[Fault], dict[str, object]]]:
    def build(name: str, nodes: int, rng: random.Random
              ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
        period = rng.uniform(60, 180)
        timing = {"moe_dwell_seconds": period} if dwell else {"moe_rotation_seconds": period}
        return _job(name, nodes, "moe", comm_seconds=0.8 if network else 0.2,
                    **timing), [], {}
    return build


def _moe_persistent(network: bool, fault: str | None = None, severity: float = 1.0
                    ) -> Callable[[str, int, random.Random],
                                  tuple[JobSpec, list[Fault], dict[str, object]]]:
    def build(name: str, nodes: int, rng: random.Random
              ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
        job = _job(name, nodes, "moe", comm_seconds=0.8 if network else 0.2,
                   moe_walk_sigma=rng.uniform(0.05, 0.15),
                   moe_walk_steps=rng.uniform(200, 2000),
                   moe_replace_steps=rng.uniform(1000, 3000), moe_fixed_hot=1,
                   moe_amplitude=rng.uniform(0.2, 0.5))
        if fault is None:
            return job, [], {}
        node, gpu = rng.choice(job.nodes), str(rng.randrange(job.gpus_per_node))
        return job, [Fault(fault, name, node, gpu, START + FAULT_AT, severity=severity)], {}
    return build


def _steps(compute: float, comm: float, fault: str | None = None, severity: float = 1.0
           ) -> Callable[[str, int, random.Random],
                         tuple[JobSpec, list[Fault], dict[str, object]]]:
    def build(name: str, nodes: int, rng: random.Random
              ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
        job = _job(name, nodes, compute_seconds=compute, comm_seconds=comm)
        if fault is None:
            return job, [], {}
        node, gpu = rng.choice(job.nodes), str(rng.randrange(job.gpus_per_node))
        return job, [Fault(fault, name, node, gpu, START + FAULT_AT, severity=severity)], {}
    return build


def _heterogeneous(name: str, nodes: int, rng: random.Random
                   ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
    return _job(name, nodes, heterogeneity=0.03), [], {}


def _shrinking(name: str, nodes: int, rng: random.Random
               ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
    job = _job(name, nodes)
    job.leaves = {n: START + FAULT_AT for n in job.nodes[-max(1, nodes // 4):]}
    return job, [], {}


def _lossy(name: str, nodes: int, rng: random.Random
           ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
    job = _job(name, nodes)
    return job, [], {"node_loss": {rng.choice(job.nodes): 0.4}}


def _clocks(name: str, nodes: int, rng: random.Random
            ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
    job = _job(name, nodes)
    ahead, drifting = rng.sample(job.nodes, 2)
    return job, [], {"offsets": {ahead: 30.0}, "drift": {drifting: 60.0}}


def _memory_work(name: str, nodes: int, rng: random.Random
                 ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
    return _job(name, nodes, memory_work_gpus=1,
                memory_work_extra=rng.uniform(0.15, 0.30)), [], {}


def _degraded_at_start(name: str, nodes: int, rng: random.Random
                       ) -> tuple[JobSpec, list[Fault], dict[str, object]]:
    job = _job(name, nodes)
    node, gpu = rng.choice(job.nodes), str(rng.randrange(job.gpus_per_node))
    return job, [Fault("slow_gpu_quiet", name, node, gpu, START, severity=1.3)], {}


CLASSES = (
    PhysicsClass("moe_rotating", _moe(network=False)),
    PhysicsClass("moe_rotating_net", _moe(network=True)),
    PhysicsClass("moe_hot_dwell", _moe(network=False, dwell=True)),
    PhysicsClass("moe_hot_dwell_net", _moe(network=True, dwell=True)),
    PhysicsClass("heterogeneous", _heterogeneous),
    PhysicsClass("shrinking", _shrinking),
    PhysicsClass("lossy_node", _lossy),
    PhysicsClass("clock_offset", _clocks),
    PhysicsClass("quiet_12", _gpu_fault("slow_gpu_quiet", 1.12), effect="10–12 %"),
    PhysicsClass("quiet_25", _gpu_fault("slow_gpu_quiet", 1.25), effect="25 %+"),
    PhysicsClass("slow_40", _gpu_fault("slow_gpu", 1.4), effect="25 %+"),
    PhysicsClass("slow_host", _gpu_fault("slow_host", 1.25), effect="25 %+"),
    PhysicsClass("thermal_creep", _gpu_fault("thermal_creep", 1.3), duration=1080.0,
                 effect="creep to 30 %"),
    PhysicsClass("quiet_5", _gpu_fault("slow_gpu_quiet", 1.05), duration=1200.0,
                 effect="5 %"),
    PhysicsClass("degraded_at_start", _degraded_at_start, effect="25 %+"),
    PhysicsClass("moe_persistent", _moe_persistent(network=False)),
    PhysicsClass("moe_persistent_net", _moe_persistent(network=True)),
    PhysicsClass("steps_short", _steps(0.24, 0.06)),
    PhysicsClass("steps_long", _steps(24.0, 6.0)),
    PhysicsClass("moe_stall_15", _moe_persistent(False, "slow_gpu_quiet", 1.15),
                 effect="15 % beside MoE"),
    PhysicsClass("moe_throttled", _moe_persistent(False, "slow_gpu", 1.25), effect="25 %+"),
    PhysicsClass("quiet_25_long_steps", _steps(8.0, 2.0, "slow_gpu_quiet", 1.25),
                 effect="25 %+"),
    PhysicsClass("memory_work", _memory_work),
)


def physics_suite(seeds: tuple[int, ...], sizes: tuple[int, ...] = SIZES,
                  classes: tuple[PhysicsClass, ...] = CLASSES) -> list[Scenario]:
    """Every class at every size and seed, with the suite's usual impairments (±3 s
    skew, 1 % loss, 2 s reordering)."""
    out = []
    for seed in seeds:
        for cls in classes:
            for nodes in sizes:
                name = f"{cls.name}-{nodes}n-s{seed}"
                job, faults, extra = cls.build(name, nodes, random.Random(name))
                cluster = Cluster([job], faults, skew_seconds=3.0, loss=0.01,
                                  reorder_seconds=2.0, **extra)  # type: ignore[arg-type]
                out.append(Scenario(name, cluster, seed, duration=cls.duration, start=START))
    return out
