"""`vigil report JOB`: what a job's GPUs did, as numbers (this module) and as a
self-contained HTML page with plots (``vigil.report_html``).

From a trace file or the samples topic, the job's samples are binned in event time
into per-GPU matrices of SM, tensor and DRAM activity (rows = ``node/gpu``), link
throughput per bin, the detections the engine raises over the same samples (the code
``vigil replay`` and the worker run), the GPU-time split into compute, exposed
communication and idle, and the tensor-core peaks Moneo reports (under 35 % in
real training).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from contracts.config import DetectConfig
from contracts.messages import Detection, Sample
from contracts.status import HEAT_METRICS, gpu_key_order
from detectors.engine import JobEngine
from detectors.robust import robust_z

HEAT = HEAT_METRICS  # the live view's and the report's heat: one list
TENSOR_PEAK_QUANTILE = 0.99
MOSTLY_LOW_TENSOR = 0.35  # Moneo: tensor-core peaks under 35 % in real training
STANDS_OUT_Z = 3.5
STANDS_OUT_FLOOR = 0.01  # activity differences under 1 point are noise, not a story
MAX_BINS = 720  # longer traces get wider bins, so a plot stays readable


@dataclass
class ReportData:
    """Everything the report shows, as arrays and plain values."""

    job: str
    start: float
    bin_seconds: float
    rows: list[str]  # "node/gpu"
    heat: dict[str, np.ndarray]  # metric → rows × bins (NaN: no reading)
    nvlink: np.ndarray  # bytes/s over the job's GPUs, per bin
    ib: np.ndarray  # bytes/s over the job's NICs, per bin
    detections: list[Detection]
    samples: int
    shares: dict[str, float] = field(default_factory=dict)  # compute/communication/idle
    tensor_peaks: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per row
    stands_out: list[tuple[str, str, float, float]] = field(default_factory=list)

    @property
    def times(self) -> np.ndarray:
        """Bin start, seconds since the first sample."""
        return np.arange(self.nvlink.size) * self.bin_seconds

    def row_means(self, metric: str) -> np.ndarray:
        """Each GPU's mean of ``metric`` over the trace (NaN if never read)."""
        with np.errstate(all="ignore"):
            m = self.heat[metric]
            counts = np.sum(~np.isnan(m), axis=1)
            return np.where(counts > 0, np.nansum(m, axis=1) / np.maximum(counts, 1), np.nan)


def build(samples: Iterable[Sample], job: str, cfg: DetectConfig) -> ReportData:
    """Bin one job's samples (arrival order) and run its detectors over them."""
    engine = JobEngine(job, cfg)
    detections: list[Detection] = []
    acc: dict[tuple[str, int], list[float]] = {}  # (row, bin) → sums + counts per metric
    node_links: dict[tuple[str, int], list[float]] = {}  # (node, bin) → [NVLink, IB, n]
    gpu_link: dict[tuple[str, int], float] = {}  # (row, bin) → NVLink bytes/s of that GPU
    node_ib: dict[tuple[str, int], float] = {}  # (node, bin) → IB bytes/s
    collected = [s for s in samples if s["job"] == job]
    if not collected:
        raise ValueError(f"no samples of job {job!r}")
    first = min(s["ts"] for s in collected)
    span = max(s["ts"] for s in collected) - first
    bin_seconds = cfg.bin_seconds * max(1, math.ceil(span / cfg.bin_seconds / MAX_BINS))
    for sample in collected:
        detections.extend(engine.ingest(sample))
        detections.extend(engine.advance())
        b = int((sample["ts"] - first) // bin_seconds)
        node = sample["node"]
        node_nv = 0.0
        for gpu, readings in sample["gpus"].items():
            row = f"{node}/{gpu}"
            cell = acc.setdefault((row, b), [0.0] * (2 * len(HEAT)))
            for i, m in enumerate(HEAT):
                if (v := readings.get(m)) is not None:
                    cell[2 * i] += v
                    cell[2 * i + 1] += 1
            nv = (readings.get("nvlink_tx") or 0.0) + (readings.get("nvlink_rx") or 0.0)
            gpu_link[(row, b)] = max(gpu_link.get((row, b), 0.0), nv)
            node_nv += nv
        node_ib_now = sum((n.get("ib_tx") or 0.0) + (n.get("ib_rx") or 0.0)
                          for n in sample["nics"].values())
        lk = node_links.setdefault((node, b), [0.0, 0.0, 0.0])
        lk[0] += node_nv
        lk[1] += node_ib_now
        lk[2] += 1
        node_ib[(node, b)] = max(node_ib.get((node, b), 0.0), node_ib_now)
    rows = sorted({r for r, _ in acc}, key=gpu_key_order)
    bins = max(b for _, b in acc) + 1
    index = {r: i for i, r in enumerate(rows)}
    heat = {m: np.full((len(rows), bins), np.nan) for m in HEAT}
    for (row, b), cell in acc.items():
        for i, m in enumerate(HEAT):
            if cell[2 * i + 1]:
                heat[m][index[row], b] = cell[2 * i] / cell[2 * i + 1]
    nvlink, ib = np.zeros(bins), np.zeros(bins)  # the job's total: each node's bin mean
    for (_, b), (nv_sum, ib_sum, n) in node_links.items():
        nvlink[b] += nv_sum / n
        ib[b] += ib_sum / n
    data = ReportData(job, first, bin_seconds, rows, heat, nvlink, ib,
                      [d for d in detections if d["state"] == "firing"], len(collected))
    data.shares = _shares(data, gpu_link, node_ib)
    data.tensor_peaks = _tensor_peaks(data)
    data.stands_out = _stands_out(data)
    return data


def _shares(data: ReportData, gpu_link: dict[tuple[str, int], float],
            node_ib: dict[tuple[str, int], float]) -> dict[str, float]:
    """An estimate of where GPU time went, averaged over GPU-bins: compute is the SM
    activity; communication is the rest of the time while links were busy (the GPU's
    NVLink or its node's IB, as a share of the job's peak, capped at the SM idle time);
    idle is what remains."""
    sm = data.heat["sm_active"]
    nv_peak = max(gpu_link.values(), default=0.0) or 1.0
    ib_peak = max(node_ib.values(), default=0.0) or 1.0
    compute = comm = 0.0
    n = 0
    for i, row in enumerate(data.rows):
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


def _tensor_peaks(data: ReportData) -> np.ndarray:
    """Each GPU's peak tensor-core activity (its 99th percentile over bins)."""
    t = data.heat["tensor_active"]
    with warnings.catch_warnings():  # a GPU without tensor readings: NaN, said once here
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.asarray(np.nanquantile(t, TENSOR_PEAK_QUANTILE, axis=1))


def _stands_out(data: ReportData) -> list[tuple[str, str, float, float]]:
    """(GPU or node, metric, its mean, robust z) for what sits far from its peers, most
    extreme first: each GPU against the other GPUs of its node (pipeline stages differ
    legitimately, the GPUs of one node do not), each node against the job's nodes.
    A slow GPU often reads *higher*: it computes while its peers wait for it."""
    nodes: dict[str, list[int]] = {}
    for i, row in enumerate(data.rows):
        nodes.setdefault(row.rpartition("/")[0], []).append(i)
    found: list[tuple[str, str, float, float]] = []
    for m in HEAT:
        means = data.row_means(m)
        groups = [([data.rows[i] for i in idx], means[idx]) for idx in nodes.values()]
        node_means = np.array([np.nanmean(v) if np.any(~np.isnan(v)) else np.nan
                               for _, v in groups])
        groups.append((list(nodes), node_means))
        for names, values in groups:
            if np.sum(~np.isnan(values)) < 4:
                continue
            z = robust_z(values[:, None], abs_floor=STANDS_OUT_FLOOR)[0][:, 0]
            found.extend((names[i], m, float(values[i]), float(z[i]))
                         for i in range(len(names)) if abs(z[i]) >= STANDS_OUT_Z)
    return sorted(found, key=lambda f: -abs(f[3]))
