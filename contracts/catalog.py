"""The metric catalog: the one table every stage reads.

The sampler's reads, the schema's allowed names and bounds, the detectors'
metric sets and Prometheus names all come from ``CATALOG``; no metric name is
spelled anywhere else as a definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    """Where a metric lives in a ``vigil.sample/1`` message."""

    GPU = "gpu"
    HOST = "host"
    NIC = "nic"


class Kind(StrEnum):
    """How a metric behaves over time (drives sampling and validation)."""

    RATIO = "ratio"  # 0..1 averaged over the interval
    GAUGE = "gauge"  # instantaneous level
    RATE = "rate"  # per-second throughput
    COUNTER = "counter"  # cumulative, never negative
    STATE = "state"  # discrete health state (link width, event code, bitmask)


@dataclass(frozen=True)
class Metric:
    """One catalog row. ``high`` bounds absurd values; ``health`` marks metrics that
    are published the moment they change instead of on the adaptive schedule."""

    name: str
    unit: str
    scope: Scope
    kind: Kind
    description: str
    high: float
    health: bool = False


_G, _H, _N = Scope.GPU, Scope.HOST, Scope.NIC
_TB = 1e13  # 10 TB/s: no link in service moves more than this
_PB = 2.0**60  # absurd memory / counter ceiling
_CY = 1e14  # cycles/s: 100 THz summed over every SM is beyond any GPU

CATALOG: tuple[Metric, ...] = (
    Metric("sm_active", "ratio", _G, Kind.RATIO, "share of SMs with a warp resident", 1.0),
    Metric("sm_occupancy", "ratio", _G, Kind.RATIO, "resident warps / max warps per SM", 1.0),
    Metric("tensor_active", "ratio", _G, Kind.RATIO, "tensor-core pipe activity", 1.0),
    Metric("fp16_active", "ratio", _G, Kind.RATIO, "FP16 pipe activity", 1.0),
    Metric("fp32_active", "ratio", _G, Kind.RATIO, "FP32 pipe activity", 1.0),
    Metric("fp64_active", "ratio", _G, Kind.RATIO, "FP64 pipe activity", 1.0),
    Metric("dram_active", "ratio", _G, Kind.RATIO, "device memory bandwidth utilisation", 1.0),
    Metric("gpu_util", "ratio", _G, Kind.RATIO, "NVML utilisation: a kernel was running", 1.0),
    Metric("gr_engine_active", "ratio", _G, Kind.RATIO,
           "graphics/compute engine active (DCGM 1001): a kernel on any SM", 1.0),
    # DCGM >= 4.6 raw cycle counters (1084-1086; NVML GPM 248-250) as rates over the
    # sample interval: mma_cycles_active / sm_cycles_elapsed is tensor activity, and
    # mma_cycles_active itself is the GPU's work rate at whatever clock it ran.
    Metric("sm_cycles_elapsed", "cycles/s", _G, Kind.RATE, "SM cycles elapsed", _CY),
    Metric("sm_cycles_active", "cycles/s", _G, Kind.RATE,
           "SM cycles with a warp resident", _CY),
    Metric("mma_cycles_active", "cycles/s", _G, Kind.RATE,
           "cycles the tensor (MMA) pipes worked", _CY),
    Metric("power", "W", _G, Kind.GAUGE, "board power draw", 5000.0),
    Metric("temperature", "°C", _G, Kind.GAUGE, "GPU core temperature", 200.0),
    Metric("sm_clock", "MHz", _G, Kind.GAUGE, "SM clock", 10000.0),
    Metric("mem_clock", "MHz", _G, Kind.GAUGE, "memory clock", 20000.0),
    Metric("mem_used", "bytes", _G, Kind.GAUGE, "device memory in use", _PB),
    Metric("nvlink_tx", "bytes/s", _G, Kind.RATE, "NVLink bytes sent", _TB),
    Metric("nvlink_rx", "bytes/s", _G, Kind.RATE, "NVLink bytes received", _TB),
    Metric("nvlink_total", "bytes/s", _G, Kind.RATE,
           "NVLink bytes both ways, where an exporter does not split them", _TB),
    Metric("pcie_tx", "bytes/s", _G, Kind.RATE, "PCIe bytes sent", _TB),
    Metric("pcie_rx", "bytes/s", _G, Kind.RATE, "PCIe bytes received", _TB),
    Metric("pcie_gen", "generation", _G, Kind.STATE, "current PCIe link generation", 16, True),
    Metric("pcie_width", "lanes", _G, Kind.STATE, "current PCIe link width", 64, True),
    Metric("ecc_sbe", "count", _G, Kind.COUNTER, "volatile single-bit ECC errors", _PB, True),
    Metric("ecc_dbe", "count", _G, Kind.COUNTER, "volatile double-bit ECC errors", _PB, True),
    Metric("pcie_replay", "count", _G, Kind.COUNTER, "PCIe replay counter, cumulative", _PB,
           True),
    Metric("remapped_rows_correctable", "count", _G, Kind.COUNTER,
           "HBM rows remapped for correctable errors", _PB, True),
    Metric("remapped_rows_uncorrectable", "count", _G, Kind.COUNTER,
           "HBM rows remapped for uncorrectable errors", _PB, True),
    Metric("row_remap_pending", "flag", _G, Kind.STATE,
           "a row remap waits for a GPU reset (1) or not (0)", 1, True),
    Metric("row_remap_failure", "flag", _G, Kind.STATE,
           "a row remap failed (1): the GPU must be replaced", 1, True),
    Metric("xid", "code", _G, Kind.STATE, "XID error seen in the interval, 0 for none", 1e6, True),
    Metric("throttle", "bitmask", _G, Kind.STATE, "NVML clocks-event reasons", 2.0**64, True),
    Metric("compute_processes", "count", _G, Kind.STATE,
           "compute processes on the GPU, every context (NVML)", 4096, True),
    Metric("cpu_util", "ratio", _H, Kind.RATIO, "host CPU utilisation", 1.0),
    Metric("mem_used", "bytes", _H, Kind.GAUGE, "host memory in use", _PB),
    Metric("ib_tx", "bytes/s", _N, Kind.RATE, "InfiniBand/RoCE bytes sent", _TB),
    Metric("ib_rx", "bytes/s", _N, Kind.RATE, "InfiniBand/RoCE bytes received", _TB),
    Metric("ib_rate", "Gb/s", _N, Kind.STATE, "current link rate", 10000.0, True),
    Metric("ib_errors", "count", _N, Kind.COUNTER,
           "symbol + receive errors + link-downed, cumulative", _PB, True),
    Metric("ib_xmit_wait", "ticks/s", _N, Kind.RATE, "transmit back-pressure ticks", _TB),
)


def by_scope(scope: Scope) -> dict[str, Metric]:
    """Catalog rows of one scope, keyed by metric name."""
    return {m.name: m for m in CATALOG if m.scope is scope}


GPU_METRICS = by_scope(Scope.GPU)
HOST_METRICS = by_scope(Scope.HOST)
NIC_METRICS = by_scope(Scope.NIC)
