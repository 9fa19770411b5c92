"""What a fault costs its job: the step-time inflation behind each detection.

In a synchronous job every healthy GPU does the same work each step, however long
the step lasts: it computes its share, then waits at the barrier for the slowest
and communicates. When a fault stretches the step from ``T0`` to ``T``, the healthy
GPUs' *compute duty cycle* (the share of time their tensor cores, or SMs, are busy)
falls by ``T0 / T``. So, from counters alone::

    job_slowdown = 1 / mean_b(r_b) - 1,   r_b = mean_i(level_i,b / healthy_i)

where ``level_i,b`` is node ``i``'s median duty cycle in bin ``b`` and ``healthy_i``
its own mean over the newest ``HEALTHY_BINS`` bins before the onset that are not
pauses (trimmed: a bin at a pause's edge), taken once when the condition first
appears and kept while it stays open. Means, not medians, before and after: a
node's level in a bin is skewed (now and then a bin holds one more compute phase
than most: on one case measured, its mean sat 0.7 % above its median), and the
goodput the truth is made of follows the mean.
Each node is read against itself, not the job's level against the job's: nodes of
a pipeline's stages, or of hot and cold MoE experts, sit at levels of their own,
and a median of their levels is an order statistic of a mixture that a slowdown
moves by less than it moves each node. ``mean_i`` leaves out the highest and lowest
``TRIM_SHARE`` of the nodes' ratios (a node alone in a pause; with few nodes, a
median is noisier than a mean). The peers are every node but a blamed one
(one blamed GPU barely moves its node's median, so its node stays), at most
``MAX_BASE_NODES`` of them. The mean runs over the bins since the onset (its own
bin left out once a later one is in: the onset is known to a bin or so), the
newest ``ESTIMATE_BINS`` of them: a 5 s bin covers a fraction of a step that
changes from bin to bin, so under window-averaged counters the job's level beats
by a few percent from one bin to the next (measured: ±2-5 %), and only the mean of
many bins reads a slowdown of 5-10 % to a quarter of itself. The first estimate
(at the detection, often one or two bins in) is therefore the roughest; each step
re-estimates, and the resolved message carries the incident's median estimate.
The cost follows: ``gpu_hours_lost_per_hour = job_gpus × job_slowdown / (1 +
job_slowdown)``: the share of the job's GPU time that goes to waiting for the
fault. A hang costs the whole job (``gpu_hours_lost_per_hour = job_gpus``,
``job_slowdown`` null: its steps never end).

``evidence.cost_basis`` says how the figure was made:

- ``baseline``: the method above.
- ``blamed``: no healthy bins before the onset were seen (the fault predates what
  Vigil has of the job, or a checkpoint sat just before it). For a straggler or a
  throttled GPU the blamed device never waits at the barrier, so its own duty cycle
  stands in for the healthy one: ``level_blamed / level_now - 1``, the median over
  the newest ``RECENT_BINS``. This overstates the cost by the comm share the longer
  step dilutes (about +20 % relative on a step that is a fifth communication).
- ``none``: nothing to compare with (a link or network fault first seen already
  in progress): the cost fields are null.

Limits, said plainly: the method assumes a synchronous job whose per-step work
does not change while the fault is open. Bins whose ``r`` falls below
``PHASE_FLOOR`` (a checkpoint or evaluation pause) are skipped, and the last
estimate is held through them. Two faults open in one job at once each see the
combined slowdown. A job that changes its batch size or model in the middle (a new
phase of training) is read as a slowdown or a speed-up. The duty-cycle counters
include the small SM activity of communication kernels, which biases the estimate
a little low when communication is a large share. A slowdown of 1-2 % (a 5 % slow
GPU on a step that is partly communication) is at the level's noise for minutes.
"""

from __future__ import annotations

import math
import statistics
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.robust import Array, nanmedian, quantile
from vigil_gpu_monitor.detectors.window import WindowView

GPU_READS = ("tensor_active", "sm_active")  # duty-cycle counters, best first
NIC_READS: tuple[str, ...] = ()
COSTED_KINDS = frozenset({"straggler", "link_health", "network_bound", "hang"})
MIN_LEVEL = 0.02  # a duty cycle below this reads as idle: no basis for a ratio
DUTY_WAIT_BINS = 8  # bins (40 s: a 30 s step and more) tensor work has to show up in
PHASE_FLOOR = 0.4  # a bin below this share of the baseline is a pause, not a slowdown
RECENT_BINS = 3  # the blamed basis: how many post-onset bins its level is the median of
ESTIMATE_BINS = 24  # the baseline basis: the newest post-onset bins it reads (2 min)
HISTORY_BINS = 48  # bins of per-node levels kept to find the healthy level in
HEALTHY_QUANTILE = 0.75  # of the pre-onset levels: a pause is below PHASE_FLOOR of it
HEALTHY_BINS = 12  # the newest pre-onset bins (not pauses) a node's healthy level is read from
MAX_BASE_NODES = 64  # peer nodes an estimate reads (a fixed, hash-chosen subset beyond it)
MIN_HEALTHY_BINS = 3
TRIM_SHARE = 0.1  # of a bin's nodes' ratios, or of a node's healthy bins, left out at each end
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


def job_duty_metric(series: Callable[[str], Array], memory: dict[str, Any]) -> str | None:
    """The job's duty-cycle counter, chosen once and kept in ``memory["metric"]``
    (levels learned on one counter are not read on another): the best one read at a
    usable level in the newest bin. A lesser one only once the better has had
    ``DUTY_WAIT_BINS`` bins to show, unless the job has no reading of it at all (an
    exporter without the field): a job first read in its warm-up reads little tensor
    work, and a choice made there held for good (fleet soak: a 10 s-step MoE job's
    first bin read tensor activity 0.018 with the capped clock's wander, 0.025
    without; SM activity, its counter then, beats with the step, and raised two false
    slowdowns in the hour). The straggler test chooses its work basis the same way
    (``straggler._work_basis``). None while waiting."""
    chosen = memory.get("metric")
    if chosen is not None:
        return str(chosen)
    memory["metric_bins"] = seen = int(memory.get("metric_bins", 0)) + 1
    for metric in GPU_READS:
        values = series(metric)
        if np.isnan(values).all():
            continue  # no such field: the next one at once
        if float(nanmedian(values.ravel(), axis=0)) >= MIN_LEVEL:
            memory["metric"] = metric
            return metric
        if seen < DUTY_WAIT_BINS:
            return None  # a better counter still has time to show work
    if seen >= DUTY_WAIT_BINS:
        memory["metric"] = GPU_READS[-1]
        return GPU_READS[-1]
    return None


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
    levels: Array | None = None  # the newest bins', only if a blamed basis needs them
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
        if metric is None:  # the job's first bins: no level to cost against yet
            f.evidence.update(cost_fields(job_gpus, None, "baseline"))
            continue
        entry = entries.get(f.key)
        if entry is None or (entry["basis"] == "baseline" and "nodes" not in entry):
            # (the second: a checkpoint of a version that kept the job's level only)
            entry = entries[f.key] = _baseline(f, _onset_bin(view, f), memory["history"])
        if entry["basis"] == "baseline":
            slowdown = _from_baseline(entry, memory["history"])
        elif entry["basis"] == "blamed":
            if levels is None:  # each node's median in the bins an estimate reads
                levels = nanmedian(view.per_node(metric, last=RECENT_BINS), axis=1)
            slowdown = _from_blamed(view, f, levels, metric)
        else:
            slowdown = None
        if slowdown is not None:
            entry["last"] = slowdown
        f.evidence.update(cost_fields(job_gpus, entry.get("last"), entry["basis"]))
    for key in [k for k in entries if k not in seen and k not in open_keys]:
        del entries[key]


def _record_level(view: WindowView, memory: dict[str, Any]) -> str | None:
    """Append the newest bin's median duty cycle of each node's GPUs to the job's
    history (``memory["history"]``, bounded); returns the duty metric (None while
    the job's is not chosen yet, ``job_duty_metric``: nothing recorded)."""
    metric = job_duty_metric(view.gpu, memory)
    if metric is None:
        return None
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


def _baseline(f: Finding, onset: int, history: list[list[Any]]) -> dict[str, Any]:
    """Each peer node's healthy level before the ``onset`` bin, or the basis to fall
    back on (``history``: the job's ``[bin, {node: level}]``, oldest first).

    The healthy bins are the newest ``HEALTHY_BINS`` before the onset that are not
    pauses (a job level below ``PHASE_FLOOR`` of the upper quartile, ``HEALTHY_QUANTILE``,
    of those bins); a node's healthy level is its trimmed mean over them (a bin at
    the edge of a pause is left out; the upper quartile itself sat two thirds of a
    spread above the level)."""
    out = _excluded(f)
    before = [(float(statistics.median(peers.values())), peers)
              for b, nodes in history if b < onset - 1
              if (peers := {n: v for n, v in nodes.items() if n != out})]
    if len(before) >= MIN_HEALTHY_BINS:
        top = quantile([level for level, _ in before], HEALTHY_QUANTILE)
        healthy = [peers for level, peers in before if level >= PHASE_FLOOR * top]
        healthy = healthy[-HEALTHY_BINS:]
        if top >= MIN_LEVEL and len(healthy) >= MIN_HEALTHY_BINS:
            per_node: dict[str, list[float]] = {}
            for peers in healthy:
                for node, v in peers.items():
                    per_node.setdefault(node, []).append(v)
            if len(per_node) > MAX_BASE_NODES:  # bounded state; any subset reads the same
                kept = sorted(per_node, key=lambda n: zlib.crc32(n.encode()))[:MAX_BASE_NODES]
                per_node = {n: per_node[n] for n in kept}
            bases = {n: level for n, vs in per_node.items() if len(vs) >= MIN_HEALTHY_BINS
                     if (level := _trimmed_mean(vs)) >= MIN_LEVEL}
            if bases:
                return {"basis": "baseline", "onset": onset, "ratios": [], "nodes": bases}
    if f.node is not None and f.kind in ("straggler", "gpu_health"):
        return {"basis": "blamed"}
    return {"basis": "none"}


def _from_baseline(entry: dict[str, Any], history: list[list[Any]]) -> float | None:
    """The slowdown since the onset: ``1 / mean(r) − 1`` over the newest
    ``ESTIMATE_BINS`` bins since it that are not pauses, where a bin's ``r`` is the
    trimmed mean over the peer nodes (those with a healthy level in ``entry``: a
    blamed node has none) of each node's level over its healthy level. The mean of
    ``r`` is the truth's own form: the goodput lost, not a typical bin. Each bin's
    ``r`` is worked out once, when the bin is new (kept in ``entry["ratios"]``).
    None: no usable bin yet."""
    ratios: list[list[float]] = entry["ratios"]
    base: dict[str, float] = entry["nodes"]
    done = ratios[-1][0] if ratios else entry["onset"] - 1
    for b, nodes in history:
        if b <= done:
            continue
        r = [v / base[n] for n, v in nodes.items() if n in base]
        if r:
            ratios.append([b, _trimmed_mean(r)])
    del ratios[:-ESTIMATE_BINS]
    # the onset's own bin is read only while it is the only one: the onset is known to
    # a bin or so, and a reading averages a window that may reach back before it
    settled = [r for b, r in ratios if b > entry["onset"]] or [r for _, r in ratios]
    usable = [r for r in settled if r >= PHASE_FLOOR]
    if not usable:
        return None
    return max(0.0, 1.0 / statistics.fmean(usable) - 1.0)


def _trimmed_mean(values: list[float]) -> float:
    """The mean of ``values`` without the highest and lowest ``TRIM_SHARE`` of them."""
    values = sorted(values)
    cut = int(len(values) * TRIM_SHARE)
    return statistics.fmean(values[cut:len(values) - cut])


def _from_blamed(view: WindowView, f: Finding, levels: Array, metric: str) -> float | None:
    """The slowdown against the blamed device's own duty cycle, the median over the
    bins since the onset among the newest ``RECENT_BINS`` (at least the newest);
    None when none of them can say. ``levels``: each node's median duty cycle in
    those newest bins (nodes × bins)."""
    out = _excluded(f)
    peers = np.array([n != out for n in view.nodes], dtype=bool)
    if not peers.any() or f.node not in view.nodes:
        return None
    now = nanmedian(levels[peers], axis=0)
    shown = now.shape[0]
    # the first of the view's bins at or after the onset (``bins`` is a range), as an
    # index into the newest ``shown``
    first = min(max(_onset_bin(view, f) - view.bins.start, 0), len(view.bins) - 1)
    recent = slice(max(first - (len(view.bins) - shown), 0), None)
    row = _gpu_row(view, f.node, f.gpu)
    reference = (view.gpu(metric)[row, -shown:] if row is not None
                 else levels[view.nodes.index(f.node)])
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
