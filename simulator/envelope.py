"""The physics envelope: what the hardware's documentation leaves open, drawn from a range.

DESIGN principle 16: where a quantity is not fixed by a document, the simulator draws
it per job, node or GPU from its documented range, so that detectors are measured at
both ends instead of at the one value a simulator happened to pick. Each range and
its source:

- ``nccl_channels`` 2–32 (per job): a GPU waiting in a collective runs NCCL's kernel,
  one CTA per channel, and each CTA holds its SM for as long as it spins
  (NVIDIA/nccl#1656), so ``sm_active`` while waiting is ``channels / 132``. NCCL's own
  log on H100 reads "24 coll channels" (NVIDIA/nccl#1781); NVLS/SHARP jobs offload
  the reduction and run few (2–4): a fifth of the draws. Measured on an H200
  (``bench/real_gpu_envelope.py``): a kernel of 2, 8, 24, 32 or 132 CTAs polling a
  flag reads ``sm_active`` CTAs / 132 to the third decimal, ``gpu_util`` 100 %,
  tensor activity 0, and 122–140 W.
- ``util_period`` 1/6–1 s (per job: one product): NVML's ``utilization.gpu`` is the
  "percent of time over the past sample period during which one or more kernels was
  executing", with a period of 1/6 s to 1 s by product (nvmlDeviceGetUtilizationRates).
  It is read at the agent's read instant, in integer percent (floored here), all 8
  GPUs of a node at the same instant. Measured on an H200: 200 ms (the spacing of
  ``nvmlDeviceGetSamples``' timestamps); under a 250 ms kernel every 500 ms, a 1 s
  poll read 86 % for 4 s and then 0 % for 6 s, where the true mean is 50 %.
- ``power_limit`` 500–700 W (per job: the board's enforced limit; 700 W is the H100
  SXM's default, lower where operators cap it) and ``compute_watts`` 750–1,050 W: what a
  GPU would draw computing at its nominal 1,980 MHz. An H100 under training load
  runs at its limit; the driver lowers the clock until the draw fits (DVFS; draw
  ~ clock² here, as ``simulator/physics.py`` has it) and sets clocks-event reason
  0x4 (SW power cap) while it does (nvmlClocksEventReasons). Measured on an H200: a
  transformer's training steps held 692 W at 1,635 MHz under 700 W and 493 W at
  1,335 MHz under 500 W, 0x4 set throughout; by this law both are a
  ``compute_watts`` of 973–976 W, inside the range. Products alone on random data
  draw more (1,150–1,250 W by the law), on zeros far less (487 W).
- ``silicon_sigma`` 0–4 % (σ of a GPU's power at the same work: leakage) and
  ``temp_sigma`` 0–4 °C (σ of a GPU's slot temperature: airflow in the chassis);
  the usual part-to-part and slot spread of a fleet.
- ``tick`` 1–30 s (the agent's sample interval; 30 s is dcgm-exporter's default
  scrape), ``tick_jitter`` 0–10 % of the tick (a read late or early), ``clock_skew``
  0–5 s (node clocks uniform in ± this), ``loss`` 0–5 % (lost samples).
- ``stale_rate`` 0–10 %: a DCGM profiling field repeated unchanged for a tick (its
  watch had no new value when it was read).
- ``nics`` 4 or 8 InfiniBand ports per node.
- ``clock_jitter`` 0.5–3 % (per job): σ of a power-capped GPU's clock over its cap's
  settled value, a wander with a time constant of ``CLOCK_WANDER_SECONDS``. The
  driver holds the draw, not the clock: as the step's mix, the temperature and the
  leakage move, the clock moves at constant power. Measured on an H200
  (``bench/real_gpu_envelope.py``, read once a second): a transformer's training at
  700 W moved its clock by 2.7 % (σ over the mean) while its draw moved 0.5 %, with a
  lag-1 autocorrelation of 0.83 and 0.55 at 3 s; at 500 W 1.4 %; products on random
  data 0.8-1.2 % at 500-700 W. An uncapped clock read the same value every time. Every
  reading is a multiple of 15 MHz.
- ``host_gap`` 0–8 %: the share of each step in which a healthy GPU runs no kernel
  (the host launching the step, the data loader handing over the batch). A healthy
  job's ``gpu_util`` is below 100 % by this much, and under a last-period reading its
  nodes jump with where the read instant falls in the step.

``draw(rng)`` draws every quantity; ``draw(rng, {"nccl_channels": "low"})`` pins one
at an end of its range. Pure standard library (the simulator imports no numpy).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# name → (low end, high end) of its documented range (sources in the module docstring)
RANGES: dict[str, tuple[float, float]] = {
    "nccl_channels": (2.0, 32.0),
    "util_period": (1.0 / 6.0, 1.0),
    "power_limit": (500.0, 700.0),
    "compute_watts": (750.0, 1050.0),
    "silicon_sigma": (0.0, 0.04),
    "temp_sigma": (0.0, 4.0),
    "tick": (1.0, 30.0),
    "tick_jitter": (0.0, 0.1),
    "clock_skew": (0.0, 5.0),
    "loss": (0.0, 0.05),
    "stale_rate": (0.0, 0.1),
    "nics": (4.0, 8.0),
    "host_gap": (0.0, 0.08),
    "clock_jitter": (0.005, 0.03),  # last: adding it left every other draw as it was
}
PARAMETERS = tuple(RANGES)
TICKS = (1.0, 2.0, 5.0, 10.0, 15.0, 30.0)  # agent intervals seen in practice
CLOCK_WANDER_SECONDS = 5.0  # time constant of a capped clock's wander (the H200's ticks)
NVLS_SHARE = 0.2  # share of jobs whose collectives run on NVLS/SHARP with few channels


class EnvelopeError(ValueError):
    """A pin that names no parameter or no end of a range."""


@dataclass(frozen=True)
class Envelope:
    """One job's draw of every open quantity (see the module docstring for ranges)."""

    nccl_channels: int = 24
    util_period: float = 1.0 / 6.0
    power_limit: float = 700.0
    compute_watts: float = 900.0
    silicon_sigma: float = 0.02
    temp_sigma: float = 2.0
    tick: float = 1.0
    tick_jitter: float = 0.02
    clock_skew: float = 3.0
    loss: float = 0.01
    stale_rate: float = 0.02
    nics: int = 8
    host_gap: float = 0.03
    clock_jitter: float = 0.015

    @property
    def waiting_sm(self) -> float:
        """``sm_active`` of a GPU spinning in a collective: one SM per channel."""
        return min(1.0, self.nccl_channels / 132.0)


def _free(name: str, rng: random.Random) -> float:
    """A value of ``name`` drawn over its range."""
    low, high = RANGES[name]
    if name == "nccl_channels":
        return float(rng.randint(2, 4) if rng.random() < NVLS_SHARE else rng.randint(8, 32))
    if name == "tick":
        return rng.choice(TICKS)
    if name == "nics":
        return rng.choice((4.0, 8.0))
    return rng.uniform(low, high)


def draw(rng: random.Random, pins: Mapping[str, str] | None = None) -> Envelope:
    """One job's envelope: every quantity drawn over its range, except those ``pins``
    holds at ``"low"`` or ``"high"``. Every quantity is drawn whether pinned or not,
    so pinning one leaves the others' draws as they were."""
    pins = dict(pins or {})
    unknown = set(pins) - set(RANGES)
    if unknown:
        raise EnvelopeError(f"no envelope parameter {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(PARAMETERS)}")
    values: dict[str, float] = {}
    for name in PARAMETERS:
        value = _free(name, rng)
        end = pins.get(name)
        if end is not None:
            if end not in ("low", "high"):
                raise EnvelopeError(f"pin {name} at 'low' or 'high', not {end!r}")
            value = RANGES[name][0 if end == "low" else 1]
        values[name] = value
    return Envelope(nccl_channels=int(values["nccl_channels"]),
                    nics=int(values["nics"]),
                    **{k: v for k, v in values.items() if k not in ("nccl_channels", "nics")})


def capped_clock(draw_at: Callable[[float], float], limit: float, top: float,
                 floor: float = 0.3, near: float | None = None) -> float:
    """The highest clock (a share of nominal, at most ``top``) at which ``draw_at(clock)``
    (watts, rising with the clock) fits under ``limit``, to 0.1 %: what the driver's
    power capping settles on. ``top`` when the draw already fits. ``near``: where it
    settled last time (a step's draw moves little from one tick to the next), tried
    first as a bracket of ±1 %."""
    if draw_at(top) <= limit:
        return top
    low, high = floor, top
    if near is not None and floor + 0.01 < near < top - 0.01:
        if draw_at(near - 0.01) <= limit < draw_at(near + 0.01):
            low, high = near - 0.01, near + 0.01
    while high - low > 1e-3:
        mid = (low + high) / 2
        if draw_at(mid) <= limit:
            low = mid
        else:
            high = mid
    return low
