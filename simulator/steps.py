"""Per-rank step timings (``vigil.step/1``) from the simulator's own job physics.

The cluster simulator (``simulator/cluster.py``) sets, every tick, each GPU's phases
within a step (``GpuPhases``: idle for its host's input, computing, waiting at the
barrier, communicating). Its counters are window averages of that timeline; the
timings here are the same timeline read the way a training loop reads it:

- a rank's ``compute`` is the time before it reached the gradient collective: its
  host's delay (``idle``, a CPU-side stall: its GPU runs no kernel meanwhile, its
  counters look idle, not busy) plus its GPU's compute;
- every rank's ``wall`` is the step: the slowest rank's compute plus communication;
- **sequence-length variation**: each step's work is drawn once for the whole job
  (a log-normal factor of σ ``seq_sigma``), so it moves every rank together; a
  window's counters, shares of time, do not see it;
- a hung job ends no step; checkpoints and evaluation passes end none either (the
  loop's step clock restarts after them);
- each rank's measurement jitters by ``jitter`` (timer and launch noise).

Ranks are numbered node by node (``node index × GPUs per node + GPU``); a pipeline
job's stage is its node's stage (``JobSpec.stage_of``), its data-parallel rank the
rank among the GPUs of that stage. Draws come from this module's own generator, so
attaching it leaves every sample of a seed exactly as it was.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vigil_gpu_monitor.contracts import STEP_SCHEMA
from vigil_gpu_monitor.contracts.messages import RankSteps, StepBatch, StepTiming
from vigil_gpu_monitor.simulator.physics import GpuPhases

if TYPE_CHECKING:
    from vigil_gpu_monitor.simulator.cluster import Fault, JobSpec

PAUSES = ("checkpoint", "eval")  # whole-job phases in which no training step ends


@dataclass
class _Clock:
    """One job's step clock: when its last step ended, its index, and the draws of the
    step in progress (redrawn as soon as it ends)."""

    last_end: float
    index: int
    seq: float = 1.0
    jitter: dict[tuple[str, str], float] = field(default_factory=dict)


def rank_stall(job: JobSpec, faults: Iterable[Fault], key: tuple[str, str]) -> float:
    """Seconds a rank's own host process delays it each step (a ``slow_host`` fault
    that names a GPU: a garbage-collection pause, a slow data worker of that rank):
    its GPU waits idle, with no kernel, while its peers wait for it at the barrier."""
    return sum((f.severity - 1.0) * job.compute_seconds for f in faults
               if f.kind == "slow_host" and f.node == key[0] and f.gpu == key[1])


class StepTimings:
    """Records each job's steps as ``vigil.step/1`` batches, one per node per tick."""

    def __init__(self, seed: int = 0, seq_sigma: float = 0.05, jitter: float = 0.005,
                 seq_sigmas: dict[str, float] | None = None,
                 node_clock: Callable[[str, float], float] | None = None) -> None:
        self._rng = random.Random(f"{seed}-steps")
        self.seq_sigma = seq_sigma
        self.seq_sigmas = seq_sigmas or {}
        self.jitter = jitter
        self.node_clock = node_clock  # node, true time → its clock's offset (s)
        self._clocks: dict[str, _Clock] = {}
        self._pending: list[StepBatch] = []
        # job → [(true end, index, wall)] of every step recorded: the ground truth
        self.walls: dict[str, list[tuple[float, int, float]]] = {}

    def drain(self) -> list[StepBatch]:
        """The batches recorded since the last call (each node's ranks for the steps
        that ended in one tick)."""
        out, self._pending = self._pending, []
        return out

    def observe(self, job: JobSpec, t: float, tick: float,
                phases: dict[tuple[str, str], GpuPhases], faults: Iterable[Fault],
                event: str | None) -> None:
        """Record the steps of ``job`` that ended in the tick ``(t - tick, t]``, from
        its GPUs' phases in that tick (``(node, gpu)`` → phases)."""
        kinds = {f.kind for f in faults if f.job == job.name}
        silent = {f.node for f in faults if f.job == job.name and f.kind == "node_silent"}
        if not phases or "hang" in kinds:
            return
        clock = self._clocks.get(job.name)
        if event in PAUSES:
            if clock is not None:
                clock.last_end = t  # the pause is not a step: the clock restarts after it
            return
        if clock is None:
            period = next(iter(phases.values())).period
            clock = self._clocks[job.name] = _Clock(t - self._rng.uniform(0, period), 0)
            self._draw(job, clock, phases)
        by_node: dict[str, list[tuple[str, StepTiming]]] = {}
        while True:
            computes = {k: (p.idle + p.compute) * clock.seq * clock.jitter[k]
                        for k, p in phases.items()}
            comm = max(p.comm for p in phases.values()) * clock.seq
            wall = max(computes.values()) + comm
            end = clock.last_end + wall
            if end > t:
                break
            self.walls.setdefault(job.name, []).append((end, clock.index, wall))
            for (node, gpu), compute in computes.items():
                if node in silent:
                    continue
                stamp = end + (self.node_clock(node, end) if self.node_clock else 0.0)
                by_node.setdefault(node, []).append((gpu, {
                    "step": clock.index, "end": round(stamp, 4), "wall": round(wall, 5),
                    "compute": round(min(compute, wall), 5)}))
            clock.last_end, clock.index = end, clock.index + 1
            self._draw(job, clock, phases)
        for node, records in by_node.items():
            self._pending.append(self._batch(job, node, records))

    def _draw(self, job: JobSpec, clock: _Clock, phases: dict[tuple[str, str], GpuPhases]
              ) -> None:
        """The next step's draws: its sequence-length factor (one for the whole job,
        mean 1) and each rank's measurement jitter."""
        sigma = self.seq_sigmas.get(job.name, self.seq_sigma)
        clock.seq = math.exp(self._rng.gauss(-sigma * sigma / 2, sigma)) if sigma else 1.0
        clock.jitter = {k: max(0.5, self._rng.gauss(1.0, self.jitter)) for k in phases}

    def _batch(self, job: JobSpec, node: str, records: list[tuple[str, StepTiming]]
               ) -> StepBatch:
        n = job.nodes.index(node)
        stages = job.kind == "pipeline"
        stage = job.stage_of(n) if stages else 0
        # data-parallel rank: the node's position among the nodes of its stage
        replica = sum(1 for i in range(n) if job.stage_of(i) == stage) if stages else n
        ranks: dict[str, RankSteps] = {}
        for gpu, timing in records:
            entry = ranks.get(gpu)
            if entry is None:
                entry = ranks[gpu] = {"rank": n * job.gpus_per_node + int(gpu), "gpu": gpu,
                                      "dp": replica * job.gpus_per_node + int(gpu),
                                      "steps": []}
                if stages:
                    entry["stage"] = stage
            entry["steps"].append(timing)
        return {"schema": STEP_SCHEMA, "job": job.name, "node": node, "source": "simulator",
                "ranks": list(ranks.values())}
