"""What a fault costs its job: the step-time inflation behind each detection.

In a synchronous job every healthy GPU does the same work each step, however long
the step lasts: it computes its share, then waits at the barrier for the slowest
and communicates. When a fault stretches the step from ``T0`` to ``T``, the healthy
GPUs' *compute duty cycle* (the share of time their tensor cores, or SMs, are busy)
falls by ``T0 / T``. So, from counters alone::

    job_slowdown = level_before / level_now - 1

where ``level`` is, bin by bin, the median over the job's nodes of each node's
median duty cycle, leaving out a blamed node (one blamed GPU barely moves its
node's median, so its node stays). ``level_before`` is the upper quartile of that
level over the last ``HISTORY_BINS`` bins that ended before the fault began (the
job's own healthy step shape: pauses and the fault itself read lower), taken once
when the condition first appears and kept for as long as it stays open.
``level_now`` is the median over the latest ``RECENT_BINS`` bins since the onset. The cost follows:
``gpu_hours_lost_per_hour = job_gpus × job_slowdown / (1 + job_slowdown)``: the
share of the job's GPU time that goes to waiting for the fault. A hang costs the
whole job (``gpu_hours_lost_per_hour = job_gpus``, ``job_slowdown`` null: its steps
never end).

``evidence.cost_basis`` says how the figure was made:

- ``baseline``: the method above.
- ``blamed``: no healthy bins before the onset were seen (the fault predates what
  Vigil has of the job, or a checkpoint sat just before it). For a straggler or a
  throttled GPU the blamed device never waits at the barrier, so its own duty cycle
  stands in for the healthy one: ``level_blamed / level_now - 1``. This overstates
  the cost by the comm share the longer step dilutes (about +20 % relative on a
  step that is a fifth communication).
- ``none``: nothing to compare with (a link or network fault first seen already
  in progress): the cost fields are null.

Limits, said plainly: the method assumes a synchronous job whose per-step work
does not change while the fault is open. Bins whose level falls below
``PHASE_FLOOR`` of the baseline (a checkpoint or evaluation pause) are skipped,
and the last estimate is held through them. Two faults open in one job at once
each see the combined slowdown. A job that changes its batch size or model in
the middle (a new phase of training) is read as a slowdown or a speed-up. The
duty-cycle counters include the small SM activity of communication kernels,
which biases the estimate a little low when communication is a large share.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from detectors.findings import Finding
from detectors.robust import Array, nanmedian
from detectors.window import WindowView

GPU_READS = ("tensor_active", "sm_active")  # duty-cycle counters, best first
NIC_READS: tuple[str, ...] = ()
COSTED_KINDS = frozenset({"straggler", "link_health", "network_bound", "hang"})
MIN_LEVEL = 0.02  # a duty cycle below this reads as idle: no basis for a ratio
PHASE_FLOOR = 0.4  # a bin below this share of the baseline is a pause, not a slowdown
RECENT_BINS = 3  # how many post-onset bins the current level is the median of
HISTORY_BINS = 48  # bins of per-node levels kept to find the healthy level in
HEALTHY_QUANTILE = 0.75  # of the pre-onset levels: pauses and the fault read lower
MIN_HEALTHY_BINS = 3
TRACE_HEALTHY_QUANTILE = 0.9  # the report's whole-trace healthy level


def is_costed(f: Finding) -> bool:
    """Findings whose fault slows the whole job: stragglers, link faults,
    network-bound phases, hangs, and throttled GPUs."""
    return f.kind in COSTED_KINDS or (f.kind == "gpu_health" and f.metrics == ("throttle",))


def gpu_hours_lost(job_gpus: int, slowdown: float) -> float:
    """GPU-hours per hour a job of ``job_gpus`` loses to a ``slowdown`` of its steps
    (``math.inf``: a hang, the whole job)."""
    return float(job_gpus) if math.isinf(slowdown) else job_gpus * slowdown / (1 + slowdown)


def duty_metric(series: Callable[[str], Array]) -> str:
    """The first duty-cycle counter (``GPU_READS``) read at a usable level;
    ``series(metric)`` gives its readings (NaN: none)."""
    for metric in GPU_READS:
        values = series(metric)
        # the detectors' own median: ``np.nanmedian`` goes through masked arrays on
        # small inputs (60-90 µs a call) and imports ``numpy.ma`` on its first
        if np.any(~np.isnan(values)) and float(nanmedian(values.ravel(), axis=0)) >= MIN_LEVEL:
            return metric
    return GPU_READS[-1]


def excess_slowdown(busy: float, peer_busy: float) -> float:
    """The job's slowdown while one GPU (or node) computes ``busy`` of the time and
    its peers ``peer_busy`` (SM activity: the compute share of the step). Its peers
    wait the difference ``d`` every step; were the work even, the step would be that
    much shorter: ``d / (1 − d)``."""
    d = min(max(busy - peer_busy, 0.0), 0.9)
    return d / (1.0 - d)


def cost_fields(job_gpus: int, slowdown: float | None, basis: str) -> dict[str, Any]:
    """The evidence fields of one estimate (rounded for the wire); basis ``hang``
    costs the whole job."""
    if basis == "hang":
        lost: float | None = float(job_gpus)
    else:
        lost = None if slowdown is None else gpu_hours_lost(job_gpus, slowdown)
    return {"job_slowdown": None if slowdown is None else round(slowdown, 4),
            "job_gpus": job_gpus, "cost_basis": basis,
            "gpu_hours_lost_per_hour": None if lost is None else round(lost, 3)}


def annotate(view: WindowView, findings: list[Finding], memory: dict[str, Any],
             open_keys: set[str]) -> None:
    """Add the cost fields to the evidence of every costed finding, in place.

    ``memory`` (part of the engine's persisted state) keeps the job's recent
    per-node levels, each condition's baseline and its last estimate. A
    condition's entry is forgotten once it is neither found now nor in
    ``open_keys`` (the conditions the incident tracker still holds).
    """
    if not view.gpus:
        return
    metric = _record_level(view, memory)
    levels: Array | None = None  # the newest bins', only if a finding is costed
    job_gpus = len(view.gpus)
    entries: dict[str, Any] = memory.setdefault("findings", {})
    seen = set()
    for f in findings:
        if not is_costed(f):
            continue
        seen.add(f.key)
        if f.kind == "hang":
            f.evidence.update(cost_fields(job_gpus, None, "hang"))
            continue
        entry = entries.get(f.key)
        if entry is None:
            entry = entries[f.key] = _baseline(view, f, memory)
        if levels is None:  # each node's median in the bins an estimate reads
            levels = nanmedian(view.per_node(metric, last=RECENT_BINS), axis=1)
        slowdown = _estimate(view, f, entry, levels, metric)
        if slowdown is not None:
            entry["last"] = slowdown
        f.evidence.update(cost_fields(job_gpus, entry.get("last"), entry["basis"]))
    for key in [k for k in entries if k not in seen and k not in open_keys]:
        del entries[key]


def _record_level(view: WindowView, memory: dict[str, Any]) -> str:
    """Append the newest bin's median duty cycle of each node's GPUs to the job's
    history (``memory["history"]``, bounded); returns the duty metric."""
    metric = memory.get("metric")
    if metric is None:
        metric = memory["metric"] = duty_metric(view.gpu)
    history: list[list[Any]] = memory.setdefault("history", [])
    newest = view.bins[-1]
    if not history or history[-1][0] < newest:
        levels = nanmedian(view.latest_per_node((metric,))[0], axis=1)
        history.append([newest, {node: round(v, 5) for node, v  # v == v: not NaN
                                 in zip(view.nodes, levels.tolist(), strict=True)
                                 if v == v}])
        del history[:-HISTORY_BINS]
    return str(metric)


def _excluded(f: Finding) -> str | None:
    """The node left out of the peers: a blamed node. One blamed GPU barely moves
    its node's median, so its node stays (one-node jobs keep their peers)."""
    return f.node if f.gpu is None else None


def _onset_bin(view: WindowView, f: Finding) -> int:
    """The first bin that began at or after the onset."""
    return int(np.ceil(f.since / view.bin_seconds - 1e-6))


def _baseline(view: WindowView, f: Finding, memory: dict[str, Any]) -> dict[str, Any]:
    """The job's healthy level before the onset, or the basis to fall back on."""
    out = _excluded(f)
    onset = _onset_bin(view, f)
    before = [float(statistics.median(peers)) for b, nodes in memory["history"] if b < onset - 1
              if (peers := [v for n, v in nodes.items() if n != out])]
    if len(before) >= MIN_HEALTHY_BINS:
        level = float(np.quantile(before, HEALTHY_QUANTILE))
        if level >= MIN_LEVEL:
            return {"basis": "baseline", "level": level}
    if f.node is not None and f.kind in ("straggler", "gpu_health"):
        return {"basis": "blamed"}
    return {"basis": "none"}


def _estimate(view: WindowView, f: Finding, entry: dict[str, Any], levels: Array,
              metric: str) -> float | None:
    """The current slowdown, the median over the bins since the onset among the
    newest ``RECENT_BINS`` (at least the newest); None when none of them can say.
    ``levels``: each node's median duty cycle in those newest bins (nodes × bins)."""
    if entry["basis"] == "none":
        return None
    out = _excluded(f)
    peers = np.array([n != out for n in view.nodes], dtype=bool)
    if not peers.any():
        return None
    now = nanmedian(levels[peers], axis=0)
    shown = now.shape[0]
    # the first of the view's bins at or after the onset (``bins`` is a range), as an
    # index into the newest ``shown``
    first = min(max(_onset_bin(view, f) - view.bins.start, 0), len(view.bins) - 1)
    recent = slice(max(first - (len(view.bins) - shown), 0), None)
    if entry["basis"] == "baseline":
        reference = np.full(shown, entry["level"])
    elif f.node in view.nodes:  # the blamed device's own duty cycle stands in
        row = _gpu_row(view, f.node, f.gpu)
        reference = (view.gpu(metric)[row, -shown:] if row is not None
                     else levels[view.nodes.index(f.node)])
    else:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (reference / now)[recent]
        usable = (now[recent] >= PHASE_FLOOR * reference[recent]) & ~np.isnan(ratio)
    if not usable.any():
        return None
    return max(0.0, statistics.median(ratio[usable].tolist()) - 1.0)  # np.median's arithmetic


def _gpu_row(view: WindowView, node: str, gpu: str | None) -> int | None:
    """The GPU's row in the view (None: a node finding, or a GPU not reporting)."""
    if gpu is None:
        return None
    try:
        return view.gpus.index((node, gpu))
    except ValueError:
        return None


def inflation_series(levels: Array) -> Array:
    """A whole trace's step-time inflation per bin, for the report: ``levels`` is the
    job's median duty cycle per bin; its healthy level is their 90th percentile
    (``TRACE_HEALTHY_QUANTILE``: a fault may fill most of a report's span, unlike the
    minutes before a detection's onset). Pauses (below ``PHASE_FLOOR`` of it) and
    empty bins are NaN. A fault that lasts the whole trace reads as no inflation."""
    known = levels[~np.isnan(levels)]
    if not known.size:
        return np.full(levels.shape, np.nan)
    healthy = float(np.quantile(known, TRACE_HEALTHY_QUANTILE))
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.maximum(healthy / levels - 1.0, 0.0)
    return np.where(levels >= PHASE_FLOOR * healthy, out, np.nan)
