"""Whole-trace analytics of one job, for the report: where its GPU time went, each
GPU's tensor-core peak, and which GPUs or nodes sit far from their peers.

They use the same robust peer statistics as the detectors (``detectors.robust``),
over a whole trace's per-GPU means rather than a sliding window: a summary for a
person reading a report, not a detection.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from vigil_gpu_monitor.detectors.robust import Array, robust_z

TENSOR_PEAK_QUANTILE = 0.99
STANDS_OUT_Z = 3.5
STANDS_OUT_FLOOR = 0.01  # activity differences under 1 point are noise, not a story
MIN_PEERS = 4


def time_shares(rows: list[str], sm: Array, gpu_link: dict[tuple[str, int], float],
                node_ib: dict[tuple[str, int], float]) -> dict[str, float]:
    """An estimate of where GPU time went, averaged over GPU-bins: compute is the SM
    activity (``sm``: rows × bins, rows ``node/gpu``); communication is the rest of the
    time while links were busy (the GPU's NVLink or its node's IB, as a share of the
    job's peak, capped at the SM idle time); idle is what remains."""
    nv_peak = max(gpu_link.values(), default=0.0) or 1.0
    ib_peak = max(node_ib.values(), default=0.0) or 1.0
    compute = comm = 0.0
    n = 0
    for i, row in enumerate(rows):
        node = row.rpartition("/")[0]
        for b in range(sm.shape[1]):
            busy = sm[i, b]
            if math.isnan(busy):
                continue
            n += 1
            links = max(gpu_link.get((row, b), 0.0) / nv_peak,
                        node_ib.get((node, b), 0.0) / ib_peak)
            compute += busy
            comm += min(1.0 - min(busy, 1.0), links)
    n = max(n, 1)
    return {"compute": compute / n, "communication": comm / n,
            "idle": max(0.0, 1.0 - (compute + comm) / n)}


def tensor_peaks(tensor: Array) -> Array:
    """Each GPU's peak tensor-core activity (its 99th percentile over bins)."""
    with warnings.catch_warnings():  # a GPU without tensor readings: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanquantile(tensor, TENSOR_PEAK_QUANTILE, axis=1))


def stands_out(rows: list[str], means: dict[str, Array]) -> list[tuple[str, str, float, float]]:
    """(GPU or node, metric, its mean, robust z) for what sits far from its peers, most
    extreme first: each GPU against the other GPUs of its node (pipeline stages differ
    legitimately, the GPUs of one node do not), each node against the job's nodes.
    ``means``: metric → each row's mean over the trace. A slow GPU often reads
    *higher*: it computes while its peers wait for it."""
    nodes: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        nodes.setdefault(row.rpartition("/")[0], []).append(i)
    found: list[tuple[str, str, float, float]] = []
    for metric, row_means in means.items():
        groups = [([rows[i] for i in idx], row_means[idx]) for idx in nodes.values()]
        node_means = np.array([np.nanmean(v) if np.any(~np.isnan(v)) else np.nan
                               for _, v in groups])
        groups.append((list(nodes), node_means))
        for names, values in groups:
            if np.sum(~np.isnan(values)) < MIN_PEERS:
                continue
            z = robust_z(values[:, None], abs_floor=STANDS_OUT_FLOOR)[0][:, 0]
            found.extend((names[i], metric, float(values[i]), float(z[i]))
                         for i in range(len(names)) if abs(z[i]) >= STANDS_OUT_Z)
    return sorted(found, key=lambda f: -abs(f[3]))
