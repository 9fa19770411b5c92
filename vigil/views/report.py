"""`vigil report JOB`: what a job's GPUs did, as numbers (this module) and as a
self-contained HTML page with plots (``vigil.views.report_html``).

From a trace file or the samples topic, the job's samples are binned in event time
into per-GPU matrices of SM, tensor and DRAM activity (rows = ``node/gpu``), link
throughput per bin, the detections the engine raises over the same samples (the code
``vigil replay`` and the worker run), the GPU-time split into compute, exposed
communication and idle, the tensor-core peaks Moneo reports (under 35 % in
real training), and the job's estimated step-time inflation per bin (how the
detections' cost is estimated, ``detectors/cost.py``, over the whole trace).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Detection, Sample
from vigil_gpu_monitor.contracts.status import HEAT_METRICS, gpu_key_order
from vigil_gpu_monitor.detectors.cost import duty_metric, inflation_series
from vigil_gpu_monitor.detectors.engine import JobEngine
from vigil_gpu_monitor.detectors.job_profile import stands_out, tensor_peaks, time_shares
from vigil_gpu_monitor.detectors.robust import nanmedian

MOSTLY_LOW_TENSOR = 0.35  # Moneo: tensor-core peaks under 35 % in real training
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
    inflation: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per bin, NaN: pause

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
            cell = acc.setdefault((row, b), [0.0] * (2 * len(HEAT_METRICS)))
            for i, m in enumerate(HEAT_METRICS):
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
    heat = {m: np.full((len(rows), bins), np.nan) for m in HEAT_METRICS}
    for (row, b), cell in acc.items():
        for i, m in enumerate(HEAT_METRICS):
            if cell[2 * i + 1]:
                heat[m][index[row], b] = cell[2 * i] / cell[2 * i + 1]
    nvlink, ib = np.zeros(bins), np.zeros(bins)  # the job's total: each node's bin mean
    for (_, b), (nv_sum, ib_sum, n) in node_links.items():
        nvlink[b] += nv_sum / n
        ib[b] += ib_sum / n
    data = ReportData(job, first, bin_seconds, rows, heat, nvlink, ib,
                      [d for d in detections if d["state"] == "firing"], len(collected))
    data.shares = time_shares(rows, heat["sm_active"], gpu_link, node_ib)
    data.tensor_peaks = tensor_peaks(heat["tensor_active"])
    data.stands_out = stands_out(rows, {m: data.row_means(m) for m in HEAT_METRICS})
    duty = heat[duty_metric(heat.__getitem__)]
    data.inflation = inflation_series(nanmedian(duty, axis=0))
    return data
