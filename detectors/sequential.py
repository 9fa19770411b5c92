"""A one-sided CUSUM whose threshold comes from a false-alarm rate, not from scenarios.

Why CUSUM (Page's cumulative sum) rather than SPRT, GLR or fixed windows:

- **Evidence accumulates.** Each bin adds its standardised departure minus a
  reference ``k``; the sum restarts at zero when the evidence is against a fault.
  A fault of size δ (in noise units) is found after about ``h / (δ − k)`` bins, so
  the delay falls as the effect grows, where an "m of n bins" rule waits the same
  time for any size. A small fault that persists is found eventually: 5 % shows up
  in minutes, which a fixed window never sees.
- **O(1) state per stream, O(1) work per bin.** Two floats per GPU and metric,
  updated with the latest bin only: the engine never rescans the window, which a
  GLR over all change points would (its cost grows with the window, and it must
  keep the history). CUSUM is the GLR for a known shift size ``2k``; that is the
  trade made.
- **A known false-alarm rate.** For unit-variance Gaussian increments, Siegmund's
  approximation gives the mean run length between false alarms,
  ``ARL0 ≈ (e^{2kb} − 2kb − 1) / (2k²)`` with ``b = h + 1.166``. So the threshold
  is solved from one operator setting, false alarms per 1,000 stream-days.

One bin's increment is clipped at ``k + 0.55 h``: no single bin can fire alone
(one glitched reading is not a fault), and two bins of a large departure always
do, which sets the floor of the delay at two bins (10 s at 5 s bins). The clip
keeps the increment monotone in the departure, so a larger fault is never found
later than a smaller one on the same noise. The sum is capped just over the
threshold (``ceiling``), so a departure that ends is seen to end within bins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vigil_gpu_monitor.detectors.robust import Array, clamp

SIEGMUND_OFFSET = 1.166  # Siegmund's correction for the overshoot past the threshold
SECONDS_PER_DAY = 86_400.0


def siegmund_arl(h: float, k: float) -> float:
    """Mean bins between false alarms of a one-sided CUSUM with reference ``k`` and
    threshold ``h`` on unit-variance Gaussian increments."""
    b = 2 * k * (h + SIEGMUND_OFFSET)
    return (math.exp(b) - b - 1) / (2 * k * k)


def threshold_for_arl(arl: float, k: float) -> float:
    """The threshold ``h`` whose false-alarm run length is ``arl`` bins (bisection:
    ``siegmund_arl`` rises monotonically with ``h``)."""
    low, high = 0.0, 1.0
    while siegmund_arl(high, k) < arl:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if siegmund_arl(mid, k) < arl else (low, mid)
    return high


@dataclass(frozen=True)
class Cusum:
    """Reference ``k``, threshold ``h`` and the per-bin clip, in noise units."""

    k: float
    h: float

    @property
    def clip(self) -> float:
        return self.k + 0.55 * self.h

    @property
    def ceiling(self) -> float:
        """The most a sum keeps: one bin of ``2k`` over the threshold. Once a stream is
        over the threshold the decision is made; the ceiling lets it fall back under
        within a few bins of the departure ending, not after minutes of stored
        evidence."""
        return self.h + 2 * self.k

    @classmethod
    def for_rate(cls, false_alarms_per_1000_days: float, bin_seconds: float,
                 k: float = 0.5) -> Cusum:
        """The test that raises ``false_alarms_per_1000_days`` per 1,000 days of one
        stream on noise alone. ``k = 0.5``: tuned to a shift of one noise unit, the
        smallest departure worth finding."""
        if false_alarms_per_1000_days <= 0:
            raise ValueError("the false-alarm rate must be positive")
        bins_per_alarm = 1000 * SECONDS_PER_DAY / bin_seconds / false_alarms_per_1000_days
        return cls(k, threshold_for_arl(bins_per_alarm, k))

    def step(self, total: Array, z: Array) -> Array:
        """One bin: the new sums of evidence for a rise of ``z``. Where ``z`` is NaN
        (no reading, too few peers, a phase that is not compared) a sum is held."""
        return cusum_step(total, z, self.k, self.clip, self.ceiling)


def cusum_step(total: Array, z: Array, k: float | Array, clip: float | Array,
               ceiling: float | Array) -> Array:
    """``Cusum.step`` with its constants given, each a number or one per column: the
    streams of several tests advance in one pass."""
    with np.errstate(invalid="ignore"):
        # ``clamp`` is ``np.clip`` here to the bit, ``ceiling`` per column included: a
        # value of ``a - k`` is never -0.0, the one input where the two may differ
        new = clamp(total + np.minimum(z, clip) - k, 0.0, ceiling)
    return np.where(np.isnan(z), total, new)
