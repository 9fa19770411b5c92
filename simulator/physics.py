"""Counters as the hardware makes them, from one GPU's timeline within a step.

Each line follows the counter's definition (DCGM field identifiers in brackets):

- ``sm_active`` [1002]: the share of cycles with at least one warp resident on an
  SM, averaged over the SMs, *stalled or not*. It is busy time: computing keeps
  nearly every SM occupied; a spinning NCCL kernel waiting in a collective keeps
  one SM per NCCL channel (2–32 of 132: ``simulator/envelope.py``); communication
  kernels a few.
- ``tensor_active`` [1004], ``fp16_active`` [1006], ``fp32_active`` [1007]: the
  share of elapsed cycles, *at the current clock*, in which that pipe worked. A GPU
  doing ``W`` tensor cycles of work per step in a step of ``T`` seconds at clock
  ``f`` reads ``W / (f T)``: a stall (more time, same work, same clock) leaves it
  level with its peers, a lower clock raises it as much as it lowers ``f``, more
  work raises it. ``tensor_active × sm_clock`` is the work rate.
- ``dram_active`` [1005]: the share of *memory-clock* cycles the DRAM interface
  moved data. The bytes of a step over the step's time: level for a slower SM
  (stall or clock), up with more work, up when the memory clock is lowered. A
  memory-bound kernel (an embedding gather, an optimizer step, a norm) moves data
  most of its time and leaves the tensor pipes idle: a GPU with more such work is
  busier, its ``dram_active`` up, its ``tensor_active`` level or below.
- ``gpu_util`` (NVML utilization.gpu): the share of time a kernel ran, whatever it
  did: a GPU spinning in a collective reads 100 %; only a GPU waiting with no
  kernel (for its host's input) reads less.
- ``power``: the board's draw, averaged over the window: idle draw, plus what
  each phase adds. Computing costs most and scales with the clock and with how
  much of each cycle the pipes work, so a stalled GPU draws less per busy second.

A reading is the average over the agent's window (``phase_shares``); every
activity counter of one GPU in one window shares one noise factor (``counters``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SM_COUNT = 132
NOMINAL_SM_CLOCK = 1980.0
SM_CLOCK_STEP = 15.0  # MHz: every SM clock an H100/H200 reports is a multiple of it
NOMINAL_MEM_CLOCK = 2619.0
TENSOR_WHILE_COMPUTING = 0.45  # share of cycles the tensor pipes work, nominal GPU
DRAM_WHILE_COMPUTING = 0.50  # share of memory cycles moving data while computing
DRAM_WHILE_MEMORY_BOUND = 0.85  # ... in a memory-bound kernel (bandwidth-limited)
SM_WHILE_COMPUTING = 0.95
SM_WHILE_COMMUNICATING = 0.10
SM_WHILE_WAITING = 1.0 / SM_COUNT  # one spinning NCCL block
# the warps a spinning NCCL CTA keeps resident (512 threads: 16 of an SM's 64), as a
# share of the GPU's: measured on an H200, 24 CTAs read sm_occupancy 0.045
# (bench/real_gpu_envelope.py; tests/simulator/test_real_gpu_envelope.py)
OCCUPANCY_PER_SPINNING_CTA = 16.0 / 64.0 / SM_COUNT
IDLE_WATTS = 90.0


@dataclass(frozen=True)
class Speed:
    """How fast a GPU turns work into time: its SM clock and memory clock as shares
    of nominal, its stall factor (time per unit of work at the same clock: memory
    stalls, in-compute link waits; 1 = none) and its static tensor cycles per unit
    of work (kernel and silicon differences, about 1); ``memory_bound``: the share of
    its compute time in memory-bound kernels (tensor pipes idle) beyond its peers'."""

    clock: float = 1.0
    mem_clock: float = 1.0
    stall: float = 1.0
    intensity: float = 1.0
    memory_bound: float = 0.0


@dataclass(frozen=True)
class GpuPhases:
    """One GPU's step, in seconds from the step's start: idle until ``idle`` (its
    node's input not ready), computing for ``compute``, waiting in the collective
    until ``barrier`` (when the slowest GPU is done), then communicating for
    ``comm``."""

    idle: float
    compute: float
    barrier: float
    comm: float

    @property
    def period(self) -> float:
        return self.barrier + self.comm


def phase_shares(p: GpuPhases, a: float, b: float, origin: float
                 ) -> tuple[float, float, float, float]:
    """Shares of the window ``[a, b)`` spent idle, computing, waiting in the
    collective and communicating, for steps that began at ``origin`` (mod period):
    exactly, with no time step. Each phase ``[lo, hi)`` of a step gets, up to a time,
    ``whole turns * (hi - lo)`` plus the part of the current step past ``lo``; the
    window's share is that at ``b`` less that at ``a``. Each end's turns are found once
    for the four phases: the fleet soak asks for ~10^6 windows per hour of fleet."""
    period, span = p.period, b - a
    marks = (0.0, p.idle, p.idle + p.compute, p.barrier, period)
    turns_a, turns_b = math.floor((a - origin) / period), math.floor((b - origin) / period)
    into_a, into_b = a - origin - turns_a * period, b - origin - turns_b * period
    shares = []
    for lo, hi in zip(marks, marks[1:], strict=False):
        width = hi - lo
        if width <= 0:
            shares.append(0.0)
            continue
        seconds = ((turns_b * width + min(max(into_b - lo, 0.0), width))
                   - (turns_a * width + min(max(into_a - lo, 0.0), width)))
        shares.append(seconds / span)
    return shares[0], shares[1], shares[2], shares[3]


def _rates(speed: Speed) -> tuple[float, float]:
    """Tensor-pipe and DRAM shares of cycles while computing, for this speed."""
    mixed = 1.0 - speed.memory_bound  # the share of compute time in the step's usual mix
    tensor_rate = TENSOR_WHILE_COMPUTING * speed.intensity / speed.stall * mixed
    # a step's bytes over its compute time, as a share of memory-clock cycles
    dram_rate = (DRAM_WHILE_COMPUTING * speed.clock * mixed
                 + DRAM_WHILE_MEMORY_BOUND * speed.memory_bound) / (speed.stall * speed.mem_clock)
    return tensor_rate, dram_rate


def computing_watts(speed: Speed, scale: float = 1.0) -> float:
    """What computing adds to the idle draw at this speed (``scale``: the GPU's draw
    against the nominal one, from the envelope's compute watts and silicon spread)."""
    tensor_rate, dram_rate = _rates(speed)
    return scale * speed.clock ** 2 * (
        110.0 + 330.0 * tensor_rate / TENSOR_WHILE_COMPUTING
        + 60.0 * dram_rate / DRAM_WHILE_COMPUTING)


WAITING_WATTS = 55.0  # a spinning NCCL kernel, over idle
COMMUNICATING_WATTS = 90.0


def counters(shares: tuple[float, float, float, float], speed: Speed,
             noise: float = 1.0, waiting_sm: float = SM_WHILE_WAITING,
             watts_scale: float = 1.0) -> dict[str, float]:
    """The activity counters and power of one window (``noise``: the factor shared
    by every activity counter of this GPU in this window; ``waiting_sm``: the SMs a
    GPU waiting in a collective holds, one per NCCL channel; ``watts_scale``: this
    GPU's computing draw against the nominal one)."""
    idle, compute, wait, comm = shares
    tensor_rate, dram_rate = _rates(speed)

    def ratio(x: float) -> float:
        return min(1.0, max(0.0, x * noise))

    spin = waiting_sm / SM_WHILE_WAITING  # channels: each spinning CTA occupies its SM
    return {
        "sm_active": ratio(compute * SM_WHILE_COMPUTING + wait * waiting_sm
                           + comm * SM_WHILE_COMMUNICATING),
        "sm_occupancy": ratio(compute * 0.5 + comm * 0.05
                               + wait * OCCUPANCY_PER_SPINNING_CTA * spin),
        "tensor_active": ratio(compute * tensor_rate),
        "fp16_active": ratio(compute * 0.08 / speed.stall),
        "fp32_active": ratio(compute * 0.05 / speed.stall + comm * 0.02),
        "fp64_active": 0.0,
        "dram_active": ratio(compute * dram_rate + comm * 0.15),
        "gpu_util": ratio(1.0 - idle),
        "power": (IDLE_WATTS + compute * computing_watts(speed, watts_scale)
                  + wait * WAITING_WATTS + comm * COMMUNICATING_WATTS),
    }
