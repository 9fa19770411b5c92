"""A stand-in for the ``pynvml`` module on machines without a GPU (tests, benchmarks,
demos). Constants, ctypes structures and the ``NVMLError`` classes are the real
nvidia-ml-py's; only the calls that need a GPU are replaced, under their real names
and signatures, and answer in NVML's own units (mW, percent, KB/s, KiB, MiB/s).

Each call can be given a CPU cost and ``nvmlDeviceGetPcieThroughput`` its real
~20 ms block, so agent overhead can be measured honestly. Faults: ``inject_xid``,
``unsupported`` (functions that raise NotSupported), ``lose_gpu``.
"""

from __future__ import annotations

import functools
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

Profile = Callable[[int, float], dict[str, float]]  # (gpu index, time) → contract-unit values


def busy_training(index: int, t: float) -> dict[str, float]:
    """A steady training load with a little noise."""
    rng = random.Random(hash((index, int(t * 10))))
    return {"sm_active": 0.62 + rng.gauss(0, 0.01), "sm_occupancy": 0.4,
            "tensor_active": 0.3 + rng.gauss(0, 0.01), "fp16_active": 0.08,
            "fp32_active": 0.05, "fp64_active": 0.0, "dram_active": 0.3, "gpu_util": 0.99,
            "power": 480.0 + rng.gauss(0, 8), "temperature": 67.0, "sm_clock": 1980.0,
            "mem_clock": 2619.0, "mem_used": 71.5 * (1 << 30), "nvlink_tx": 30e9,
            "nvlink_rx": 30e9, "pcie_tx": 1.2e9, "pcie_rx": 1.5e9, "pcie_gen": 5.0,
            "pcie_width": 16.0, "ecc_sbe": 0.0, "ecc_dbe": 0.0, "throttle": 0.0,
            "gr_engine_active": 0.99, "sm_cycles_elapsed": 1980e6 * 132,
            "sm_cycles_active": 0.62 * 1980e6 * 132, "mma_cycles_active": 0.3 * 1980e6 * 132,
            "pcie_replay": 0.0, "remapped_rows_correctable": 0.0,
            "remapped_rows_uncorrectable": 0.0, "row_remap_pending": 0.0,
            "row_remap_failure": 0.0}


@dataclass
class _Handle:
    index: int
    minor: int


# CPU seconds per call on a real H100 (driver 580.159.04, a Firecracker VM), the
# medians of `bench/real_gpu_check.py calls` over three runs of `bench/real_gpu.sh`,
# 2026-11-26 (bench/RESULTS.md, "A real H100"); calls not listed cost under 40 µs.
# nvmlGpmMetricsGet is the cost of the metrics the agent asks for: 1.74 ms with the
# graphics-engine activity, which alone costs 1.45 ms and is no longer asked for.
REAL_H100_CALL_COSTS: dict[str, float] = {
    "nvmlDeviceGetTotalEnergyConsumption": 3.32e-3,
    "nvmlGpmMetricsGet": 14e-6,
    "nvmlDeviceGetComputeRunningProcesses": 32e-6,
    "nvmlDeviceGetPcieReplayCounter": 0.47e-3,
    "nvmlGpmSampleGet": 0.17e-3,
    "nvmlDeviceGetCurrPcieLinkWidth": 0.13e-3,
    "nvmlDeviceGetUtilizationRates": 30e-6,
    "nvmlDeviceGetMemoryInfo": 20e-6,
    "nvmlEventSetWait_v2": 20e-6,
    "nvmlGpmSampleAlloc": 14e-6,
    "nvmlDeviceGetTotalEccErrors": 10e-6,
}


class FakeNvml:
    """Module-like object: ``FakeNvml(gpus=8).nvmlDeviceGetPowerUsage(handle)`` etc."""

    def __init__(self, gpus: int = 8, hopper: bool = True, profile: Profile = busy_training,
                 call_cost: float = 0.0, pcie_block: float = 0.0, h100_costs: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.gpus = gpus
        self.hopper = hopper
        self.profile = profile
        self.call_cost = call_cost
        # each call at what it cost on a real H100 (REAL_H100_CALL_COSTS), the rest at
        # call_cost
        self.call_costs = REAL_H100_CALL_COSTS if h100_costs else {}
        self.pcie_block = pcie_block
        self.clock = clock
        self.calls = 0
        self.unsupported: set[str] = set()
        self.gpm_max_metric = 1 << 16  # an older driver knows fewer GPM metrics
        self.processes: dict[int, int] = {}  # GPU index → compute processes (default 1)
        self.lost: set[int] = set()
        self._events: deque[tuple[int, int]] = deque()
        self._nvlink_kib: dict[int, list[float]] = {}
        self._nvlink_t: dict[int, float] = {}
        self._energy: dict[int, tuple[float, float]] = {}  # GPU → (when, mJ)
        self._last_sampled: _Handle | None = None
        self._profile_cache: dict[int, tuple[tuple[int, int], dict[str, float]]] = {}
        self._handles = [_Handle(i, minor=i + 10 if i % 2 else i) for i in range(gpus)]

    def __getattr__(self, name: str) -> Any:  # constants, structs, errors: the real ones
        return getattr(pynvml, name)

    # faults
    def inject_xid(self, index: int, code: int) -> None:
        self._events.append((index, code))

    def lose_gpu(self, index: int) -> None:
        self.lost.add(index)

    def _enter(self, name: str, handle: _Handle | None = None) -> None:
        self.calls += 1
        cost = self.call_costs.get(name, self.call_cost)
        if cost:
            end = time.perf_counter() + cost
            while time.perf_counter() < end:  # an ioctl costs CPU, not just time
                pass
        if name in self.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if handle is not None and handle.index in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    def _v(self, handle: _Handle) -> dict[str, float]:
        """The profile's values for this GPU now, computed once per 0.1 s: a real GPU's
        readings cost the driver's time (``call_cost``), not the fake's own arithmetic,
        which would otherwise be charged to the agent in the overhead benchmark."""
        now = self.clock()
        key = (handle.index, int(now * 10))
        cached = self._profile_cache.get(handle.index)
        if cached is None or cached[0] != key:
            cached = self._profile_cache[handle.index] = (key, self.profile(handle.index, now))
        return cached[1]

    # the calls NvmlSource makes, with pynvml's names and signatures
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        return self._handles[index]

    def nvmlDeviceGetMinorNumber(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetMinorNumber", h)
        return h.minor

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetName", h)
        return "NVIDIA H100 80GB HBM3" if self.hopper else "NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        info = pynvml.c_nvmlProcessInfo_v3_t if hasattr(pynvml, "c_nvmlProcessInfo_v3_t") \
            else pynvml.c_nvmlProcessInfo_t
        found = []
        for i in range(self.processes.get(h.index, 1)):
            process = info()
            process.pid, process.usedGpuMemory = 4000 + 100 * h.index + i, 1 << 30
            found.append(process)
        return found

    def nvmlDeviceGetArchitecture(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetArchitecture", h)
        # the pre-Hopper fake is an A100 (GA100): Ampere with an instant power gauge
        return int(pynvml.NVML_DEVICE_ARCH_HOPPER if self.hopper
                   else pynvml.NVML_DEVICE_ARCH_AMPERE)

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        return f"GPU-00000000-fake-{h.index:04d}"

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = round(self._v(h)["gpu_util"] * 100)
        util.memory = round(self._v(h)["dram_active"] * 100)
        return util

    def nvmlDeviceGetClockInfo(self, h: _Handle, which: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        return round(self._v(h)["sm_clock" if which == pynvml.NVML_CLOCK_SM else "mem_clock"])

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return round(self._v(h)["power"] * 1000)  # mW

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return round(self._v(h)["temperature"])

    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        memory = pynvml.c_nvmlMemory_t()
        memory.total = 80 << 30
        memory.used = int(self._v(h)["mem_used"])
        memory.free = memory.total - memory.used
        return memory

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", h)
        if self.pcie_block:
            time.sleep(self.pcie_block)
        key = "pcie_tx" if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else "pcie_rx"
        return round(self._v(h)[key] / 1000)  # KB/s

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return round(self._v(h)["pcie_gen"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return round(self._v(h)["pcie_width"])

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, kind: int, counter: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        corrected = kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        return round(self._v(h)["ecc_sbe" if corrected else "ecc_dbe"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return int(self._v(h)["throttle"])

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        now = self.clock()
        when, mj = self._energy.get(h.index, (now, 1e9))
        mj += self._v(h)["power"] * 1000.0 * max(0.0, now - when)  # W over the gap, in mJ
        self._energy[h.index] = (now, mj)
        return int(mj)

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", h)
        return round(self._v(h)["pcie_replay"])

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", h)
        v = self._v(h)
        return (round(v["remapped_rows_correctable"]), round(v["remapped_rows_uncorrectable"]),
                round(v["row_remap_pending"]), round(v["row_remap_failure"]))

    def nvmlDeviceGetFieldValues(self, h: _Handle, ids: list[int]) -> list[Any]:
        self._enter("nvmlDeviceGetFieldValues", h)
        now, v = self.clock(), self._v(h)
        totals = self._nvlink_kib.setdefault(h.index, [0.0, 0.0])
        dt = now - self._nvlink_t.get(h.index, now)
        self._nvlink_t[h.index] = now
        totals[0] += v["nvlink_tx"] / 1024 * dt
        totals[1] += v["nvlink_rx"] / 1024 * dt
        out = []
        for field_id in ids:
            fv = pynvml.c_nvmlFieldValue_t()
            fv.fieldId = field_id
            fv.nvmlReturn = 0
            fv.value.ullVal = int(totals[0 if field_id ==
                                         pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else 1])
            out.append(fv)
        return out

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, h: _Handle, types: int, event_set: object) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        if not self._events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        index, code = self._events.popleft()
        data = type("EventData", (), {})()
        data.device, data.eventType, data.eventData = self._handles[index], \
            pynvml.nvmlEventTypeXidCriticalError, code
        return data

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._enter("nvmlEventSetFree")

    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = 1 if self.hopper else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleGet(self, h: _Handle, sample: Any) -> Any:
        self._enter("nvmlGpmSampleGet", h)
        self._last_sampled = h  # real samples carry their device; this fake remembers it
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        assert self._last_sampled is not None
        metrics = request.metrics  # the fake's own Python is charged to the agent's bench
        ids = [metrics[i].metricId for i in range(request.numMetrics)]
        if any(i > self.gpm_max_metric for i in ids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        v = self._v(self._last_sampled)
        by_id = _gpm_by_id()
        for i, metric_id in enumerate(ids):
            metric, scale = by_id[metric_id]
            m = metrics[i]
            m.nvmlReturn = 0
            m.value = v[metric] / scale
        return request


@functools.cache
def _gpm_by_id() -> dict[int, tuple[str, float]]:
    """GPM metric id → (catalog metric, scale), as the NVML source reads them."""
    from vigil_gpu_monitor.producers.nvml import GPM_METRICS

    return {getattr(pynvml, name): (metric, scale) for name, (metric, scale)
            in GPM_METRICS.items() if hasattr(pynvml, name)}
