"""Straggler GPUs and nodes: the peers of a synchronous job should look alike.

A slowed GPU keeps computing while its healthy peers wait at the barrier, so its
activity, power and clock depart from theirs in a consistent direction.

- **GPU level**: each GPU is compared with the other GPUs *of its node*. They form
  one tensor-parallel group (or data-parallel replicas), so they do the same work
  whatever the pipeline stage of the node; a GPU that sits beyond the robust
  z-threshold in the same direction in most recent bins, on at least two metrics,
  is a straggler.
- **Workload or hardware.** A GPU that carries more of the work for a while (MoE
  experts that are hot now) departs from its node's others just as a slow GPU
  does, and neither need change its clock. What differs is time: hardware departs
  and stays departed; moving load departs and comes back, one GPU after another,
  and often several GPUs of one node swing together. A departure with a lower
  clock is hardware at once. One without is remembered as a run of bins per GPU;
  once another GPU's run has ended within 10 minutes the job's load is known to
  move, and a signature-less departure must then outlast ``LONG_RUN_BINS`` (4 min,
  longer than load stays on one GPU) to count; two or more GPUs of one node
  departing together without a lower clock never count at GPU level. The cost: in
  such a job a slow GPU that keeps its clock is found after 4 minutes, not 30 s;
  and the first hot GPUs of a job may still fire before its load has been seen
  to move.
- **Node level**: each node's median GPU is compared with the other nodes. Nodes of
  different pipeline stages legitimately differ, so every node has a learned
  *offset* from the job median (slow moving average, frozen while the node is
  flagged); a node is a straggler when it departs from its own offset, not from
  the others. Offsets belong to the job's steady phase: while the job median is
  away from its recent level (warm-up, checkpoints, evaluation, where stages stop
  differing) node-level comparison pauses and nothing is learned.

Limitation: a node or GPU already slow when Vigil first sees the job is learned as
that node's normal at node level (GPU level still sees a single slow GPU).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from contracts.catalog import GPU_METRICS
from detectors.findings import Finding, fmt
from detectors.robust import Array, nanmedian, persistent, robust_z, robust_z_axis
from detectors.window import WindowView

# metric → absolute floor of the peer spread (its unit): noise below this is not evidence.
STRAGGLER_METRICS: dict[str, float] = {
    "sm_active": 0.015,
    "tensor_active": 0.015,
    "dram_active": 0.015,
    "power": 10.0,
    "sm_clock": 25.0,
}
GPU_READS = tuple(STRAGGLER_METRICS)
_NAMES = tuple(STRAGGLER_METRICS)
_FLOORS = np.array([STRAGGLER_METRICS[m] for m in _NAMES])
NIC_READS: tuple[str, ...] = ()
MIN_GPU_PEERS = 4
MIN_NODE_PEERS = 3
MIN_METRICS = 2
OFFSET_TIME_CONSTANT = 600.0  # seconds: how slowly a node's normal offset adapts
OFFSET_WARMUP_UPDATES = 24  # plain running mean until a node has this many updates
LEVEL_TIME_CONSTANT = 60.0  # seconds: the job's recent level of each metric
STEADY_TOLERANCE = 0.15  # job median within this share of its recent level = steady
ROTATION_GPUS = 1  # another GPU whose departure ended: the job's load moves around
ROTATION_BINS = 120  # how long (bins: 10 min) such an ended departure is remembered
LONG_RUN_BINS = 48  # a departure outlasting this (4 min) is not moving load


@dataclass(frozen=True)
class StragglerParams:
    """Thresholds: z-score, and how many of the latest bins must be deviant."""

    z: float = 4.0
    need_bins: int = 4
    of_bins: int = 6


@dataclass
class _Deviation:
    metric: str
    z: float
    value: float
    peer: float
    first: int


def find_stragglers(view: WindowView, p: StragglerParams,
                    memory: dict[str, Any]) -> list[Finding]:
    """GPU- and node-level straggler findings for the view's latest bins.

    ``memory`` holds what the node level learns (offsets, update counts, the job's
    recent level and which bins were steady); it is updated in place and is part of
    the engine's persisted state.
    """
    if len(view.bins) < p.of_bins or not view.gpus:
        return []
    gpu_devs: dict[tuple[str, str], list[_Deviation]] = {}
    node_devs: dict[str, list[_Deviation]] = {}
    flagged_nodes: set[str] = set()
    # every metric at once: metrics × nodes × slots × bins (one numpy pass, not five)
    stack = np.stack([view.per_node(m) for m in _NAMES])
    _gpu_level(view, stack, p, gpu_devs)
    node_value = nanmedian(stack, axis=2)  # metrics × nodes × bins
    residual = node_value - np.expand_dims(nanmedian(node_value, axis=1), 1)
    residuals = {m: (node_value[i], residual[i]) for i, m in enumerate(_NAMES)}
    for i, metric in enumerate(_NAMES):
        _node_level(view, residuals[metric], metric, float(_FLOORS[i]), p, memory, node_devs)
    findings = []
    for node, devs in sorted(node_devs.items()):
        if len({d.metric for d in devs}) >= MIN_METRICS:
            flagged_nodes.add(node)
            findings.append(_finding(view, p, node, None, devs))
    candidates = {key: devs for key, devs in gpu_devs.items()
                  if key[0] not in flagged_nodes and len({d.metric for d in devs}) >= MIN_METRICS}
    explained = _workload_made(candidates, view.bins[-1], memory)
    for (node, gpu), devs in sorted(candidates.items()):
        if (node, gpu) not in explained:
            findings.append(_finding(view, p, node, gpu, devs))
    _learn(view, memory, flagged_nodes, residuals)
    return findings


def _gpu_level(view: WindowView, stack: Array, p: StragglerParams,
               out: dict[tuple[str, str], list[_Deviation]]) -> None:
    """Each GPU against the other GPUs of its node, every metric at once."""
    peers = np.sum(~np.isnan(stack[..., -1]), axis=2)  # metrics × nodes
    z = robust_z_axis(stack, axis=2, abs_floor=_FLOORS[:, None, None, None])
    test = persistent(z, p.z, p.need_bins, p.of_bins)  # metrics × nodes × slots
    for m, n, slot in zip(*np.nonzero(test.flagged), strict=True):
        if peers[m, n] < MIN_GPU_PEERS:
            continue
        node, gpu = view.gpu_at(int(n), int(slot))
        recent = stack[m, n, :, -p.of_bins:]
        out.setdefault((node, gpu), []).append(_Deviation(
            _NAMES[m], float(test.score[m, n, slot]), float(np.nanmedian(recent[slot])),
            float(np.nanmedian(nanmedian(recent, axis=0))), int(test.first[m, n, slot])))


def _signature_less(devs: list[_Deviation]) -> bool:
    """Busier than its peers, and no lower clock: what a GPU carrying more of the
    work looks like, and also a slow GPU that keeps its clock (the hard case)."""
    return not any(d.metric == "sm_clock" and d.z < 0 for d in devs)


def _workload_made(candidates: dict[tuple[str, str], list[_Deviation]], last_bin: int,
                   memory: dict[str, Any]) -> set[tuple[str, str]]:
    """The GPU-level deviations that the job's own workload explains.

    A slow GPU departs from its node's others and *stays* departed; load that moves
    between GPUs (MoE experts that are hot for a while) makes GPUs depart and come
    back, one after another. So every signature-less deviation is remembered as a
    run of bins per GPU. Once the job has shown ``ROTATION_GPUS`` other GPUs whose
    runs ended within ``ROTATION_BINS``, a signature-less deviation must outlast
    ``LONG_RUN_BINS`` (longer than such load stays on one GPU) before it counts.
    And two or more GPUs of one node departing together without a lower clock is
    the node's load shifting, not two slow GPUs.
    """
    runs: dict[str, list[int]] = memory.setdefault("runs", {})
    quiet = {key for key, devs in candidates.items() if _signature_less(devs)}
    for node, gpu in quiet:
        run = runs.get(f"{node}/{gpu}")
        if run is not None and run[1] >= last_bin - 1:
            run[1] = last_bin
        else:
            runs[f"{node}/{gpu}"] = [last_bin, last_bin]
    for key in [k for k, (_, end) in runs.items() if end < last_bin - ROTATION_BINS]:
        del runs[key]
    ended = {k for k, (_, end) in runs.items() if end < last_bin}
    per_node = Counter(node for node, _ in quiet)
    explained = set()
    for node, gpu in quiet:
        start = runs[f"{node}/{gpu}"][0]
        rotating = len(ended - {f"{node}/{gpu}"}) >= ROTATION_GPUS
        if per_node[node] >= 2 or (rotating and last_bin - start < LONG_RUN_BINS):
            explained.add((node, gpu))
    return explained


def _node_level(view: WindowView, residuals: tuple[Array, Array], metric: str, floor: float,
                p: StragglerParams, memory: dict[str, Any],
                out: dict[str, list[_Deviation]]) -> None:
    if len(view.nodes) < MIN_NODE_PEERS:
        return
    offsets = memory.get("offsets", {}).get(metric, {})
    steady = set(memory.get("steady", []))
    node_value, residual = residuals
    learned = np.array([offsets.get(n, np.nan) for n in view.nodes])
    known = ~np.isnan(learned)
    if np.count_nonzero(known) < MIN_NODE_PEERS:
        return
    in_phase = np.array([b in steady for b in view.bins])
    shifted = np.where(known[:, None] & in_phase[None, :], residual - learned[:, None], np.nan)
    z, _, _ = robust_z(shifted, floor)
    test = persistent(z, p.z, p.need_bins, p.of_bins)
    for n in np.nonzero(test.flagged)[0]:
        peer = float(np.nanmedian(node_value[:, -p.of_bins:] - residual[:, -p.of_bins:]))
        out.setdefault(view.nodes[n], []).append(_Deviation(
            metric, float(test.score[n]), float(np.nanmedian(node_value[n, -p.of_bins:])),
            peer + float(learned[n]), int(test.first[n])))


def _learn(view: WindowView, memory: dict[str, Any], frozen: set[str],
           residuals: dict[str, tuple[Array, Array]]) -> None:
    """Update the job's recent level; in a steady bin, also the node offsets."""
    last = view.bins[-1]
    levels: dict[str, float] = memory.setdefault("level", {})
    steady_now = True
    for metric, floor in STRAGGLER_METRICS.items():
        job_median = float(nanmedian(view.per_node(metric)[:, :, -1].ravel(), axis=0))
        if np.isnan(job_median):
            steady_now = False
            continue
        level = levels.get(metric, job_median)
        if abs(job_median - level) > max(STEADY_TOLERANCE * abs(level), 2 * floor):
            steady_now = False
        a = min(1.0, view.bin_seconds / LEVEL_TIME_CONSTANT)
        levels[metric] = level + a * (job_median - level)
    steady = [b for b in memory.get("steady", []) if b > last - len(view.bins)]
    memory["steady"] = [*steady, last] if steady_now else steady
    if not steady_now:
        return
    counts: dict[str, int] = memory.setdefault("updates", {})
    for metric in STRAGGLER_METRICS:
        residual = residuals[metric][1]
        table = memory.setdefault("offsets", {}).setdefault(metric, {})
        for n, node in enumerate(view.nodes):
            r = float(residual[n, -1])
            if np.isnan(r) or node in frozen:
                continue
            seen = counts.get(f"{metric}|{node}", 0) + 1
            counts[f"{metric}|{node}"] = seen
            a = max(1.0 / seen if seen <= OFFSET_WARMUP_UPDATES else 0.0,
                    min(1.0, view.bin_seconds / OFFSET_TIME_CONSTANT))
            table[node] = r if node not in table else table[node] + a * (r - table[node])
    current = set(view.nodes)
    for table in memory.get("offsets", {}).values():  # forget nodes that left the job
        for node in [k for k in table if k not in current]:
            del table[node]
    for key in [k for k in counts if k.split("|", 1)[1] not in current]:
        del counts[key]


def _finding(view: WindowView, p: StragglerParams, node: str, gpu: str | None,
             devs: list[_Deviation]) -> Finding:
    strongest: dict[str, _Deviation] = {}
    for d in sorted(devs, key=lambda d: -abs(d.z)):
        strongest.setdefault(d.metric, d)
    top = list(strongest.values())
    score = float(np.median([abs(d.z) for d in top]))
    detail = ", ".join(f"{d.metric} {fmt(d.value, GPU_METRICS[d.metric].unit)} vs peers' "
                       f"{fmt(d.peer, GPU_METRICS[d.metric].unit)}" for d in top[:2])
    who = f"GPU {gpu} on {node}" if gpu is not None else f"Node {node}"
    peers = "the other GPUs of its node" if gpu is not None else "the job's other nodes"
    evidence: dict[str, Any] = {
        "peers": peers,
        "deviations": [{"metric": d.metric, "value": round(d.value, 4),
                        "peer_median": round(d.peer, 4), "z": round(d.z, 2)} for d in top],
    }
    since = view.bin_start(min(d.first for d in top), p.of_bins)
    return Finding("straggler", node, gpu, "warning", tuple(strongest), score,
                   f"{who} is out of step with {peers}: {detail}.", since, evidence)
