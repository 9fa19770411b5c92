"""Data-driven metric selection (Moneo §2.2).

1. Drop metrics whose time series barely vary (variance of the series scaled by its
   largest magnitude below ``min_variance``): they say the same whatever runs.
2. Group metrics whose series are near-identical by Moneo's Eq. 1,
   ``d(x, y) = sqrt(sum_t ((x_t - y_t) / max_t{x_t, y_t})^2)``, and keep one per group.

Eq. 1 grows with the trace length T, so the threshold applies to ``d / sqrt(T)``
(a per-step RMS) and one threshold fits traces of any length. Distances are taken
per device (the same GPU's two metrics) and averaged over devices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil_gpu_monitor.detectors.robust import Array


@dataclass(frozen=True)
class Selection:
    """What to keep, what was dropped as constant, and each kept metric's group."""

    keep: list[str]
    constant: list[str]
    groups: dict[str, list[str]]
    distances: dict[tuple[str, str], float]


def moneo_distance(x: Array, y: Array) -> float:
    """Moneo's Eq. 1 over the steps where both series have a reading, divided by √T."""
    both = ~(np.isnan(x) | np.isnan(y))
    x, y = x[both], y[both]
    if x.size == 0:
        return float("nan")
    peak = max(float(np.max(np.abs(x))), float(np.max(np.abs(y))))
    if peak == 0:
        return 0.0
    return float(np.sqrt(np.sum(((x - y) / peak) ** 2)) / np.sqrt(x.size))


def scaled_variance(series: Array) -> float:
    """Variance of a series divided by its squared largest magnitude (unit-free, 0..1)."""
    values = series[~np.isnan(series)]
    if values.size < 2:
        return 0.0
    peak = float(np.max(np.abs(values)))
    return float(np.var(values) / peak**2) if peak else 0.0


def select_metrics(series: dict[str, Array], min_variance: float = 1e-4,
                   max_distance: float = 0.05, always_keep: frozenset[str] = frozenset()
                   ) -> Selection:
    """``series``: metric → (devices × time) array, NaN for no reading.

    ``always_keep`` metrics (health signals: quiet until the day they matter) are
    never dropped or grouped away.
    """
    constant = [m for m, a in series.items() if m not in always_keep
                and np.nanmean([scaled_variance(row) for row in a]) < min_variance]
    varying = [m for m in series if m not in constant and m not in always_keep]
    distances: dict[tuple[str, str], float] = {}
    for i, a in enumerate(varying):
        for b in varying[i + 1:]:
            per_device = [moneo_distance(x, y) for x, y in zip(series[a], series[b],
                                                                 strict=True)]
            distances[(a, b)] = float(np.nanmean(per_device)) if per_device else float("nan")
    groups: dict[str, list[str]] = {}
    assigned: set[str] = set()
    for metric in varying:  # catalog order: the first of a group represents it
        if metric in assigned:
            continue
        members = [metric] + [m for m in varying if m not in assigned and m != metric
                              and distances.get((metric, m), distances.get((m, metric), 1.0))
                              < max_distance]
        groups[metric] = members
        assigned.update(members)
    kept = [m for m in series if m in groups or m in always_keep]
    return Selection(kept, constant, groups, distances)
