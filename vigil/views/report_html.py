"""Render a ``ReportData`` as one self-contained HTML file (PNG plots inline)."""

from __future__ import annotations

import base64
import html
import io
import time
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers or in CI

import matplotlib.pyplot as plt
import numpy as np

from vigil_gpu_monitor.alerting.cost import cost_text
from vigil_gpu_monitor.contracts.status import HEAT_METRICS, HEAT_NAMES
from vigil_gpu_monitor.vigil.views.report import MOSTLY_LOW_TENSOR, ReportData
from vigil_gpu_monitor.vigil.views.report_goodput import goodput_png

MAX_ROW_LABELS = 48


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _mark_detections(ax: Any, data: ReportData, label: bool) -> None:
    for det in data.detections:
        x = det["detected_at"] - data.start
        ax.axvline(x, color="red", linewidth=1.2, linestyle="--")
        if label:
            where = det["node"] or "job"
            if det["gpu"] is not None:
                where += f"/{det['gpu']}"
            ax.annotate(f"{det['kind']} {where}", (x, 1.0), xycoords=("data", "axes fraction"),
                        rotation=90, va="top", ha="right", fontsize=7, color="red")


def heatmaps_png(data: ReportData) -> str:
    """SM, tensor and DRAM activity per GPU over time, detections marked."""
    height = max(2.5, min(10.0, 0.09 * len(data.rows) + 1.5))
    rows = len(HEAT_METRICS)
    fig, axes = plt.subplots(rows, 1, figsize=(12, height * rows), squeeze=False,
                             layout="constrained")
    extent = (0.0, float(data.times[-1] + data.bin_seconds), len(data.rows) - 0.5, -0.5)
    for ax, metric in zip(axes[:, 0], HEAT_METRICS, strict=True):
        image = ax.imshow(data.heat[metric], aspect="auto", interpolation="nearest",
                          cmap="viridis", vmin=0.0, vmax=1.0, extent=extent)
        ax.set_title(HEAT_NAMES[metric][1])
        step = max(1, len(data.rows) // MAX_ROW_LABELS)
        ax.set_yticks(range(0, len(data.rows), step))
        ax.set_yticklabels(data.rows[::step], fontsize=6)
        ax.set_xlabel("seconds since the first sample")
        fig.colorbar(image, ax=ax, fraction=0.02)
        _mark_detections(ax, data, label=metric == HEAT_METRICS[0])
    return _png(fig)


def throughput_png(data: ReportData) -> str:
    """The job's NVLink and InfiniBand throughput per bin."""
    fig, ax = plt.subplots(figsize=(12, 3.2))
    ax.plot(data.times, data.nvlink / 1e9, label="NVLink (all GPUs, tx+rx)")
    ax.plot(data.times, data.ib / 1e9, label="InfiniBand (all NICs, tx+rx)")
    ax.set_ylabel("GB/s")
    ax.set_xlabel("seconds since the first sample")
    ax.legend(loc="lower left", fontsize=8)
    _mark_detections(ax, data, label=True)
    return _png(fig)


def inflation_png(data: ReportData) -> str:
    """The job's estimated step-time inflation over time; each detection marked, with
    its own cost estimate as a dot where it has one."""
    fig, ax = plt.subplots(figsize=(12, 3.2))
    ax.plot(data.times, data.inflation * 100, color="#a33",
            label="step-time inflation (gaps: pauses, no reading)")
    for det in data.detections:
        slowdown = det["evidence"].get("job_slowdown")
        if isinstance(slowdown, int | float):
            ax.plot(det["detected_at"] - data.start, slowdown * 100, "o", color="black")
    ax.set_ylabel("% longer steps")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the first sample")
    ax.legend(loc="upper left", fontsize=8)
    _mark_detections(ax, data, label=True)
    return _png(fig)


def shares_png(data: ReportData) -> str:
    """Compute / communication / idle shares and the tensor-core peak distribution."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.0))
    names = list(data.shares)
    left.barh(names, [data.shares[n] * 100 for n in names], color=["#3a7", "#37a", "#aaa"])
    left.set_xlim(0, 100)
    left.set_xlabel("% of GPU time")
    left.set_title("Where the GPU time went")
    peaks = data.tensor_peaks[~np.isnan(data.tensor_peaks)] * 100
    right.hist(peaks, bins=20, range=(0, 100), color="#37a")
    right.axvline(MOSTLY_LOW_TENSOR * 100, color="black", linestyle=":")
    right.set_xlabel("peak tensor-core activity per GPU (%)")
    right.set_title("Tensor-core peaks (dotted: 35 %)")
    return _png(fig)


def _table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                    for r in rows)
    return ("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + cells + "</table>")


def render(data: ReportData) -> str:
    """The whole page."""
    peaks = data.tensor_peaks[~np.isnan(data.tensor_peaks)]
    low = float(np.mean(peaks < MOSTLY_LOW_TENSOR)) if peaks.size else float("nan")
    span = data.times[-1] + data.bin_seconds
    summary = [
        ["samples", f"{data.samples:,} node-samples, {len(data.rows)} GPUs, "
                    f"{len({r.rpartition('/')[0] for r in data.rows})} nodes"],
        ["time", f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(data.start))} UTC, "
                 f"{span:.0f} s in {data.bin_seconds:g} s bins"],
        ["GPU time", ", ".join(f"{k} {v:.0%}" for k, v in data.shares.items())],
        ["tensor cores", f"median per-GPU peak {np.median(peaks):.0%}, "
                         f"{low:.0%} of GPUs peak under 35 %" if peaks.size else "no readings"],
        ["detections", str(len(data.detections))],
    ]
    dets = [[f"+{d['detected_at'] - data.start:.0f} s", d["kind"], d["severity"],
             d["node"] or "-", d["gpu"] or "-", cost_text(d) or "-", d["summary"]]
            for d in data.detections]
    outliers = [[row, HEAT_NAMES[m][1], f"{mean:.0%}", f"{z:.1f}"]
                for row, m, mean, z in data.stands_out]
    images = (heatmaps_png(data), throughput_png(data), shares_png(data), inflation_png(data),
              goodput_png(data, _png, plt))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>Vigil report: {html.escape(data.job)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1200px; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; font-size: 90%; }}
img {{ max-width: 100%; }} .note {{ color: #555; font-size: 85%; }}
</style></head><body>
<h1>Job {html.escape(data.job)}</h1>
{_table(["", ""], summary)}
<h2>Detections</h2>
{_table(["when", "kind", "severity", "node", "GPU", "cost", "summary"], dets)
 if dets else "<p>none</p>"}
<h2>GPUs that stand out</h2>
<p class="note">Mean over the whole report; robust z of a GPU against the other GPUs of
its node, of a node against the job's nodes (|z| ≥ 3.5 shown). A slow GPU often reads
<em>higher</em>: it is still computing while its peers wait for it.</p>
{_table(["GPU or node", "metric", "mean", "robust z"], outliers) if outliers else "<p>none</p>"}
<h2>Step-time inflation</h2>
<img alt="inflation" src="data:image/png;base64,{images[3]}">
<p class="note">Estimated from counters: the healthy GPUs' compute duty cycle falls as
the job's steps stretch, so inflation = (the job's 90th-percentile duty cycle over the
trace) / (this bin's) − 1. Dots: each detection's own cost estimate.</p>
<h2>GPU-hours lost, by cause</h2>
<img alt="goodput" src="data:image/png;base64,{images[4]}">
<h2>Per-GPU activity</h2>
<img alt="heatmaps" src="data:image/png;base64,{images[0]}">
<h2>Link throughput</h2>
<img alt="throughput" src="data:image/png;base64,{images[1]}">
<h2>Compute, communication, tensor cores</h2>
<img alt="shares" src="data:image/png;base64,{images[2]}">
<p class="note">An estimate over all GPU-bins. Compute: SM activity. Communication: the
rest of the time, as far as the GPU's NVLink or its node's InfiniBand was busy
(throughput as a share of the job's peak). Idle: what remains. Tensor-core peak: each
GPU's 99th percentile of tensor-pipe activity; Moneo found peaks under 35 % in real training.</p>
</body></html>
"""
