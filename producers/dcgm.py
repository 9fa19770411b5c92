"""Readings scraped from an existing dcgm-exporter (Prometheus text format).

Many clusters already run NVIDIA's dcgm-exporter, which holds the profiling
counters pre-Hopper GPUs only expose through DCGM. Its field names map onto the
catalog below; the GPU comes from the ``minor_number`` label (falling back to
``gpu``). Label names changed across versions (``Hostname`` → ``hostname``) and
are not relied on. Note dcgm-exporter's default counter list leaves SM
active/occupancy, FP pipes and NVLink bytes out: enable them in its CSV.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable

from producers.reading import Reading

# DCGM field → (catalog metric, scale to contract units)
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_active", 1.0),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("fp64_active", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active", 1.0),
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util", 0.01),
    "DCGM_FI_DEV_POWER_USAGE": ("power", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock", 1.0),
    "DCGM_FI_DEV_MEM_CLOCK": ("mem_clock", 1.0),
    "DCGM_FI_DEV_FB_USED": ("mem_used", float(1 << 20)),  # MiB
    "DCGM_FI_PROF_NVLINK_TX_BYTES": ("nvlink_tx", 1.0),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": ("nvlink_rx", 1.0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("pcie_tx", 1.0),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("pcie_rx", 1.0),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie_gen", 1.0),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie_width", 1.0),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_sbe", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_dbe", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle", 1.0),
}
_LINE = re.compile(r'^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> Reading:
    """Prometheus exposition text → a Reading of the catalog metrics it holds."""
    reading = Reading()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line.strip())
        if not match or match.group(1) not in DCGM_FIELDS:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        gpu = labels.get("minor_number") or labels.get("gpu")
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        if gpu is None or not gpu.isdigit() or value != value or value in (float("inf"),
                                                                             float("-inf")):
            continue
        metric, scale = DCGM_FIELDS[match.group(1)]
        reading.gpus.setdefault(gpu, {})[metric] = max(0.0, value * scale)
    return reading


class DcgmExporterSource:
    """Scrapes ``url`` (e.g. ``http://localhost:9400/metrics``) once per tick."""

    def __init__(self, url: str, timeout: float = 2.0,
                 fetch: Callable[[str, float], str] | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.fetch = fetch or _http_get
        self.errors = 0

    def read(self, now: float) -> Reading:
        try:
            return parse(self.fetch(self.url, self.timeout))
        except OSError:
            self.errors += 1
            return Reading()


def _http_get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode("utf-8", errors="replace"))
