"""`vigil report`: the numbers behind the plots, and the self-contained page."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.views.report import build
from vigil_gpu_monitor.vigil.views.report_html import render

START = 1_860_000_000.0


def _samples(kind: str, fault: str, duration: float = 180.0) -> tuple[list, Fault]:
    job = JobSpec("rep", [f"r{i}" for i in range(4)], kind=kind)
    f = Fault(fault, "rep", "r2", "5" if fault != "nic_degraded" else None, START + 60)
    return list(Simulator(Cluster([job], [f]), START).samples(duration)), f


@pytest.mark.parametrize("kind", ["data_parallel", "pipeline", "moe"])
def test_slow_gpu_row_stands_out_in_the_heatmap(kind: str) -> None:
    samples, fault = _samples(kind, "slow_gpu")
    data = build(samples, "rep", DetectConfig())
    assert len(data.rows) == 32 and data.heat["sm_active"].shape[0] == 32
    faulty = data.rows.index("r2/5")
    onset_bin = int((fault.start - data.start) // data.bin_seconds) + 1
    after = data.heat["sm_active"][:, onset_bin:]
    row_means = np.nanmean(after, axis=1)
    others = np.delete(row_means, faulty)
    # The slow GPU computes while its peers wait: its SM row is the job's extreme.
    assert row_means[faulty] > others.max(), (row_means[faulty], others.max())
    assert data.stands_out[0][:2] == ("r2/5", "sm_active"), data.stands_out
    # No other GPU is flagged (a pipeline's stages, i.e. whole nodes, may differ).
    assert {r for r, *_ in data.stands_out if "/" in r} == {"r2/5"}
    assert any((d["node"], d["gpu"]) == ("r2", "5") for d in data.detections)
    assert sum(data.shares.values()) == pytest.approx(1.0)
    assert 0.0 < data.shares["communication"] < 1.0


def test_page_is_self_contained_with_plots_and_detections(tmp_path: Path) -> None:
    samples, _ = _samples("data_parallel", "nic_degraded")
    data = build(samples, "rep", DetectConfig())
    page = render(data)
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 5  # heatmaps, throughput, shares, inflation, GPU-hours lost
    assert all(base64.b64decode(i).startswith(b"\x89PNG\r\n\x1a\n") for i in images)
    assert "http://" not in page and "https://" not in page  # nothing fetched when opened
    assert "link_health" in page and "r2" in page
    assert data.ib.max() > 0 and data.nvlink.max() > 0
    assert "GPU-hours per hour" in page  # the detection's cost in its table row


def test_inflation_rises_with_the_fault_and_matches_the_detection() -> None:
    samples, fault = _samples("data_parallel", "slow_gpu", duration=240.0)
    data = build(samples, "rep", DetectConfig())
    onset = int((fault.start - data.start) // data.bin_seconds)
    before, after = data.inflation[2:onset - 1], data.inflation[onset + 2:]
    assert np.nanmax(before) < 0.03  # healthy: steps as long as usual
    assert np.nanmedian(after) > 0.15  # the slow GPU (x1.3) stretches every step
    [det] = [d for d in data.detections if d["kind"] == "straggler"]
    assert det["evidence"]["job_slowdown"] == pytest.approx(np.nanmedian(after), rel=0.25)


def test_cli_writes_report_from_a_trace_and_refuses_unknown_job(tmp_path: Path) -> None:
    samples, _ = _samples("data_parallel", "slow_gpu", duration=120.0)
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"\n".join(encode_sample(s) for s in samples) + b"\nnot json\n")
    out = tmp_path / "r.html"
    cli = [sys.executable, "-m", "vigil_gpu_monitor", "report"]
    done = subprocess.run([*cli, "rep", "--trace", str(trace), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "invalid lines skipped" in done.stderr and out.stat().st_size > 10_000
    missing = subprocess.run([*cli, "nope", "--trace", str(trace), "--out",
                              str(tmp_path / "n.html")], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "no samples of job 'nope'" in missing.stderr
