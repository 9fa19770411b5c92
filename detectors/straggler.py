"""Straggler GPUs and nodes: the peers of a synchronous job should look alike.

A slowed GPU keeps computing while its healthy peers wait at the barrier, so its
activity, power and often its clock depart from theirs in a consistent direction.
For every metric below, each bin's peers give a robust median and spread; a GPU is
deviant in a bin when its robust z-score passes the threshold. A GPU that is
deviant in the same direction in most recent bins, on at least two metrics, is a
straggler; when most GPUs of one node are, the node is blamed instead. Whole-job
changes (warm-up, checkpoints, evaluation) move the median, not one peer, and so
never qualify.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from contracts.catalog import GPU_METRICS
from detectors.findings import Finding, fmt
from detectors.robust import Array, robust_z
from detectors.window import Entity, JobWindow

# metric → absolute floor of the peer spread (its unit); noise below this is not evidence.
STRAGGLER_METRICS: dict[str, float] = {
    "sm_active": 0.015,
    "tensor_active": 0.015,
    "dram_active": 0.015,
    "power": 10.0,
    "sm_clock": 25.0,
}
MIN_PEERS = 4
MIN_METRICS = 2


@dataclass(frozen=True)
class StragglerParams:
    """Thresholds: z-score, and how many of the latest bins must be deviant."""

    z: float = 4.0
    need_bins: int = 3
    of_bins: int = 4


@dataclass
class _Deviation:
    metric: str
    z: float  # median signed z over the deviant bins
    value: float
    peer_median: float
    spread: float
    bins: int
    first: int  # offset of the first deviant bin among the recent ones


def _deviations(matrix: Array, floor: float,
                p: StragglerParams) -> list[tuple[int, float, int, int]]:
    """(row, median signed z, deviant bins, first deviant offset) for rows consistently off
    in the recent bins."""
    z, _, _ = robust_z(matrix, floor)
    recent = z[:, -p.of_bins:]
    found = []
    for i in range(recent.shape[0]):
        row = recent[i]
        up = int(np.sum(row > p.z))
        down = int(np.sum(row < -p.z))
        hits = max(up, down)
        if hits >= p.need_bins:
            sign = 1.0 if up >= down else -1.0
            deviant = (row * sign) > p.z
            first = int(np.argmax(deviant))
            found.append((i, float(np.median(row[deviant])), hits, first))
    return found


def find_stragglers(window: JobWindow, bins: range, p: StragglerParams) -> list[Finding]:
    """Straggler findings for the window's latest bins (GPU- or node-level)."""
    if len(bins) < p.of_bins:
        return []
    entities = window.entities("g", bins)
    if len(entities) < MIN_PEERS:
        return []
    mats = window.matrices("g", tuple(STRAGGLER_METRICS), entities, bins)
    per_gpu: dict[Entity, list[_Deviation]] = {}
    for metric, floor in STRAGGLER_METRICS.items():
        mat = mats[metric]
        if np.count_nonzero(~np.isnan(mat[:, -1])) < MIN_PEERS:
            continue
        _, median, scale = robust_z(mat, floor)
        for row, zval, hits, first in _deviations(mat, floor, p):
            recent = mat[row, -p.of_bins:]
            per_gpu.setdefault(entities[row], []).append(_Deviation(
                metric, zval, float(np.nanmedian(recent)),
                float(np.nanmedian(median[-p.of_bins:])),
                float(np.nanmedian(scale[-p.of_bins:])), hits, first))
    flagged = {e: d for e, d in per_gpu.items() if len(d) >= MIN_METRICS}
    findings = []
    for f in _blame(flagged, entities):
        first = min(d["first"] for d in f.evidence["deviations"])
        findings.append(replace(f, since=(bins[-1] - p.of_bins + 1 + first) * window.bin_seconds))
    return findings


def _blame(flagged: dict[Entity, list[_Deviation]], entities: list[Entity]) -> list[Finding]:
    gpus_per_node: dict[str, int] = {}
    for node, _ in entities:
        gpus_per_node[node] = gpus_per_node.get(node, 0) + 1
    by_node: dict[str, list[Entity]] = {}
    for entity in flagged:
        by_node.setdefault(entity[0], []).append(entity)
    findings = []
    for node, members in sorted(by_node.items()):
        total = gpus_per_node[node]
        if total > 1 and len(members) >= max(2, (total + 1) // 2):
            devs = [d for e in members for d in flagged[e]]
            findings.append(_finding(node, None, devs, [e[1] for e in members], total))
        else:
            findings.extend(_finding(node, e[1], flagged[e], [e[1]], total) for e in members)
    return findings


def _finding(node: str, gpu: str | None, devs: list[_Deviation], gpus: list[str],
             node_gpus: int) -> Finding:
    devs = sorted(devs, key=lambda d: -abs(d.z))
    strongest: dict[str, _Deviation] = {}
    for d in devs:
        strongest.setdefault(d.metric, d)
    metrics = tuple(strongest)
    score = float(np.median([abs(d.z) for d in strongest.values()]))
    top = list(strongest.values())[:2]
    detail = ", ".join(f"{d.metric} {fmt(d.value, GPU_METRICS[d.metric].unit)} vs peers' "
                       f"{fmt(d.peer_median, GPU_METRICS[d.metric].unit)}" for d in top)
    who = (f"GPU {gpu} on {node}" if gpu is not None
           else f"Node {node} ({len(gpus)}/{node_gpus} GPUs)")
    summary = f"{who} is out of step with its peers: {detail}."
    evidence = {
        "gpus": gpus,
        "deviations": [{"metric": d.metric, "value": round(d.value, 4),
                        "peer_median": round(d.peer_median, 4), "spread": round(d.spread, 4),
                        "z": round(d.z, 2), "bins": d.bins, "first": d.first}
                       for d in strongest.values()],
    }
    return Finding("straggler", node, gpu, "warning", metrics, score, summary, 0.0, evidence)
