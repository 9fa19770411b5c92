"""The report's plot of GPU-hours lost over time, by cause.

The same rule as the goodput ledger (``alerting/goodput.py``): each incident loses its
``gpu_hours_lost_per_hour`` (a hang: the job's GPUs) from its start until it resolves
(at its resolved rate) or the trace ends (at its firing rate). Cumulative per kind,
so the last point of each curve is what that cause cost the job over the trace.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vigil_gpu_monitor.contracts.messages import Detection


def _rate(det: Detection) -> float | None:
    ev = det["evidence"]
    value = ev.get("gpu_hours_lost_per_hour")
    if ev.get("cost_basis") == "hang" and value is None:
        value = ev.get("job_gpus")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def lost_by_kind(detections: list[Detection], start: float, bin_seconds: float,
                 bins: int) -> dict[str, np.ndarray]:
    """kind → cumulative GPU-hours lost at the end of each bin."""
    spans: dict[str, tuple[str, float, float, float]] = {}  # id → kind, rate, from, to
    end = start + bins * bin_seconds
    for det in detections:
        rate = _rate(det)
        if det["state"] == "firing" and rate is not None:
            spans[det["id"]] = (det["kind"], rate, det["started_at"], end)
        elif det["state"] == "resolved" and det["id"] in spans:
            kind, fired, since, _ = spans[det["id"]]
            spans[det["id"]] = (kind, rate if rate is not None else fired, since,
                                det["detected_at"])
    edges = start + bin_seconds * np.arange(1, bins + 1)
    out: dict[str, np.ndarray] = {}
    for kind, rate, since, until in spans.values():
        hours = np.clip(np.minimum(edges, until) - since, 0.0, None) / 3600 * rate
        out[kind] = out.get(kind, np.zeros(bins)) + hours
    return out


def goodput_png(data: Any, png: Any, plt: Any) -> str:
    """Cumulative GPU-hours lost by cause over the trace (``data``: ``ReportData``)."""
    series = lost_by_kind(data.detections, data.start, data.bin_seconds, len(data.times))
    fig, ax = plt.subplots(figsize=(12, 3.2))
    if series:
        ax.stackplot(data.times, *series.values(), labels=list(series), alpha=0.8)
        ax.legend(loc="upper left", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no costed incident", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_ylabel("GPU-hours lost (cumulative)")
    ax.set_xlabel("seconds since the first sample")
    return str(png(fig))
