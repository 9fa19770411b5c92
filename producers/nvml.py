"""GPU readings from NVML (nvidia-ml-py), through one choke point.

Every NVML call goes through ``NvmlSource.call``: an ``NVMLError`` (not supported,
GPU lost, …) becomes "no reading" and is counted by error name, never raised.
The NVML module is passed in (the real ``pynvml`` on a GPU node, a fake in tests
and benchmarks), and this module uses only the names in ``NVML_NAMES``, which a
test checks against the installed nvidia-ml-py.

Units: NVML gives power in mW, energy in mJ, utilisation and GPM activity in
percent, PCIe throughput in KB/s, GPM NVLink/PCIe rates in MiB/s and NVLink field
counters in KiB; the contract wants W, ratios and bytes/s. GPM's cycle metrics
(248-250) are taken as cycles/s, as the catalog defines them.

Power is the mean over the tick. On Ampere and later (GA100 aside) NVML's power
gauge is itself the mean over the last second (NVML's reference for
``nvmlDeviceGetPowerUsage``), so at ticks of 1 s or less the gauge is read alone.
Elsewhere (an older GPU's gauge is one instant; a longer tick outlasts the gauge's
second) it comes from the energy counter (``nvmlDeviceGetTotalEnergyConsumption``:
the energy between two ticks over the time between them), with the gauge on the first
tick, when the counter did not move, and where there is no counter. The counter is
the dearest call on a real H100 (3.3 ms of CPU a tick, half of all NVML's;
bench/RESULTS.md), so it is read only where it adds something.
GPM's graphics-engine activity (``NVML_GPM_METRIC_GRAPHICS_UTIL``) is not asked for:
on a real H100 it alone cost 1.45 ms of CPU in ``nvmlGpmMetricsGet``, where the other
eleven metrics cost 13 µs together (half the agent's NVML time a tick), no detector
reads it, and ``gpu_util`` (``nvmlDeviceGetUtilizationRates``, 33 µs) says the same
thing, that a kernel ran. A dcgm-exporter page still brings it (DCGM field 1001).
Remapped HBM rows, pending and failed remaps (``nvmlDeviceGetRemappedRows``) and the
number of compute processes (``nvmlDeviceGetComputeRunningProcesses``: a second one, a
leftover of an earlier job or a time-sliced tenant, puts its work in every activity
counter) are read every tick on every GPU that has them (absent where NVML says not
supported). The PCIe link's generation, width and replay counter
(``nvmlDeviceGetPcieReplayCounter``) change only with a fault and are read every
``link_interval`` seconds (5 s, one detector bin): the replay counter is the dearest
call left on a real H100 (0.5 ms of the 1.3 ms a GPU's tick costs), and the detectors
hold a reading a sample lacks (``detectors/held.py``), as they do for adaptive
sampling: a link fault shows at most 5 s later. GPUs are keyed by their device minor
number (what Slurm's GPU indices and /dev/nvidiaN use), not NVML's index.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

from vigil_gpu_monitor.producers.reading import Reading
from vigil_gpu_monitor.producers.xid import PendingXids

log = logging.getLogger(__name__)
KIB = 1024.0
MIB = 1024.0 * 1024.0

# GPM metric id name → (catalog metric, scale to contract units). Graphics-engine
# activity (NVML_GPM_METRIC_GRAPHICS_UTIL, DCGM 1001) is left out on purpose: see the
# module's docstring.
GPM_METRICS: dict[str, tuple[str, float]] = {
    "NVML_GPM_METRIC_SM_UTIL": ("sm_active", 0.01),
    "NVML_GPM_METRIC_SM_OCCUPANCY": ("sm_occupancy", 0.01),
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": ("tensor_active", 0.01),
    "NVML_GPM_METRIC_FP16_UTIL": ("fp16_active", 0.01),
    "NVML_GPM_METRIC_FP32_UTIL": ("fp32_active", 0.01),
    "NVML_GPM_METRIC_FP64_UTIL": ("fp64_active", 0.01),
    "NVML_GPM_METRIC_DRAM_BW_UTIL": ("dram_active", 0.01),
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": ("nvlink_tx", MIB),
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": ("nvlink_rx", MIB),
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": ("pcie_tx", MIB),
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": ("pcie_rx", MIB),
    "NVML_GPM_METRIC_SM_CYCLES_ELAPSED": ("sm_cycles_elapsed", 1.0),
    "NVML_GPM_METRIC_SM_CYCLES_ACTIVE": ("sm_cycles_active", 1.0),
    "NVML_GPM_METRIC_MMA_CYCLES_ACTIVE": ("mma_cycles_active", 1.0),
}
# the raw cycle counters came with newer drivers; an older one refuses a request with them
GPM_CYCLE_METRICS = ("NVML_GPM_METRIC_SM_CYCLES_ELAPSED", "NVML_GPM_METRIC_SM_CYCLES_ACTIVE",
                     "NVML_GPM_METRIC_MMA_CYCLES_ACTIVE")
NVML_NAMES = (
    "nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetMinorNumber", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetFieldValues", "nvmlEventSetCreate", "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2", "nvmlEventSetFree", "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmSampleFree", "nvmlGpmMetricsGet",
    "c_nvmlGpmMetricsGet_t", "NVMLError", "NVML_GPM_METRICS_GET_VERSION",
    "NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_TEMPERATURE_GPU", "NVML_PCIE_UTIL_TX_BYTES",
    "NVML_PCIE_UTIL_RX_BYTES", "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    "nvmlEventTypeXidCriticalError", "NVML_ERROR_TIMEOUT",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetRemappedRows", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetArchitecture", "NVML_DEVICE_ARCH_AMPERE",
    "NVML_DEVICE_ARCH_BLACKWELL", *GPM_METRICS,
)
# seconds between reads of the PCIe link's state and replay counter (module docstring)
LINK_INTERVAL = 5.0
# GA100 products (A100, A30, A800): Ampere, but their power gauge is one instant
GA100 = re.compile(r"\bA(100|30|800)\b")


class NvmlSource:
    """Reads every GPU's catalog metrics once per tick."""

    def __init__(self, nvml: Any, pcie_throughput: bool = True, interval: float = 1.0,
                 link_interval: float = LINK_INTERVAL) -> None:
        self.nvml = nvml
        self.link_interval = link_interval
        self._link_due = float("-inf")  # the PCIe link is read at the first tick
        self.errors: Counter[str] = Counter()
        self.pcie_throughput = pcie_throughput  # blocks ~20 ms per call on real GPUs
        nvml.nvmlInit()
        self.devices: dict[str, Any] = {}
        for index in range(self.call("nvmlDeviceGetCount") or 0):
            handle = self.call("nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                continue
            minor = self.call("nvmlDeviceGetMinorNumber", handle)
            self.devices[str(minor if minor is not None else index)] = handle
        self.meta = {"gpu_models": sorted({str(self.call("nvmlDeviceGetName", h))
                                           for h in self.devices.values()}),
                     "gpu_uuids": {k: str(self.call("nvmlDeviceGetUUID", h))
                                   for k, h in self.devices.items()}}
        # the GPUs whose power comes from the energy counter (see the module's docstring)
        self.energy_counter = {key for key, h in self.devices.items()
                               if interval > 1.0 or not self._gauge_is_mean(h)}
        self.events = self.call("nvmlEventSetCreate")
        if self.events is not None:
            for handle in self.devices.values():
                self.call("nvmlDeviceRegisterEvents", handle,
                          nvml.nvmlEventTypeXidCriticalError, self.events)
        self.gpm: dict[str, Any] = {}
        # the GPM metrics asked for: those these bindings name (an older nvidia-ml-py
        # lacks the cycle counters), less the cycle counters once the driver refuses them
        self.gpm_names = [name for name in GPM_METRICS if hasattr(nvml, name)]
        self._gpm_request: Any = None  # built for gpm_names, reused (``_gpm_metrics``)
        for key, handle in self.devices.items():
            support = self.call("nvmlGpmQueryDeviceSupport", handle)
            if support is not None and bool(getattr(support, "isSupportedDevice", False)):
                sample = self.call("nvmlGpmSampleAlloc")
                if sample is not None and self.call("nvmlGpmSampleGet", handle, sample) \
                        is not None:
                    self.gpm[key] = sample
        self._nvlink_prev: dict[str, tuple[float, float, float]] = {}
        self._energy_prev: dict[str, tuple[float, float]] = {}  # GPU → (when, mJ)
        self.pending = PendingXids()

    def _pcie_link(self, h: Any) -> dict[str, float]:
        """The PCIe link's generation and width and its replay counter (see the module's
        docstring for why not every tick)."""
        out = {}
        for name, call in (("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
                           ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                           ("pcie_replay", "nvmlDeviceGetPcieReplayCounter")):
            value = self.call(call, h)
            if value is not None:
                out[name] = float(value)
        return out

    def call(self, name: str, *args: Any) -> Any:
        """The choke point: an NVML call, or None (counted) when NVML says no."""
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as exc:
            self.errors[type(exc).__name__] += 1  # pynvml has one subclass per error code
            return None

    def read(self, now: float) -> Reading:
        """One tick: every device's metrics plus XID events seen since the last tick."""
        reading = Reading(meta=dict(self.meta))
        link = now >= self._link_due
        if link:
            self._link_due = now + self.link_interval - 1e-6
        for key, handle in self.devices.items():
            metrics = self._device(key, handle, now, link)
            if len(metrics) > 1:  # only "xid": the GPU stopped answering, so it is absent
                reading.gpus[key] = metrics
        for key, xid in self._xid_events():
            self.pending.push(key, xid)
        for key, metrics in reading.gpus.items():  # one XID a tick; the rest wait their turn
            metrics["xid"] = float(self.pending.pop(key))
        return reading

    def _device(self, key: str, h: Any, now: float, link: bool) -> dict[str, float]:
        """One GPU's metrics; its PCIe link too where ``link`` (every ``link_interval``)."""
        n, out = self.nvml, {}
        util = self.call("nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            out["gpu_util"] = util.gpu / 100.0
        for name, value, scale in (
                ("sm_clock", self.call("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_SM), 1.0),
                ("mem_clock", self.call("nvmlDeviceGetClockInfo", h, n.NVML_CLOCK_MEM), 1.0),
                ("power", self.call("nvmlDeviceGetPowerUsage", h), 0.001),
                ("temperature", self.call("nvmlDeviceGetTemperature", h,
                                          n.NVML_TEMPERATURE_GPU), 1.0),
                ("ecc_sbe", self.call("nvmlDeviceGetTotalEccErrors", h,
                                      n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
                 1.0),
                ("ecc_dbe", self.call("nvmlDeviceGetTotalEccErrors", h,
                                      n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
                 1.0),
                ("throttle", self.call("nvmlDeviceGetCurrentClocksEventReasons", h), 1.0)):
            if value is not None:
                out[name] = float(value) * scale
        memory = self.call("nvmlDeviceGetMemoryInfo", h)
        if memory is not None:
            out["mem_used"] = float(memory.used)
        if link:
            out.update(self._pcie_link(h))
        processes = self.call("nvmlDeviceGetComputeRunningProcesses", h)
        if processes is not None:  # every context's: device counters sum them all
            out["compute_processes"] = float(len(processes))
        rows = self.call("nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            correctable, uncorrectable, pending, failure = rows
            out.update(remapped_rows_correctable=float(correctable),
                       remapped_rows_uncorrectable=float(uncorrectable),
                       row_remap_pending=1.0 if pending else 0.0,
                       row_remap_failure=1.0 if failure else 0.0)
        power = self._energy_power(key, h, now) if key in self.energy_counter else None
        if power is not None:
            out["power"] = power
        out["xid"] = 0.0  # set in ``read`` from the event queue
        if key in self.gpm:
            out.update(self._gpm(key, h))
        elif self.pcie_throughput:  # pre-Hopper: PCIe from the (blocking) counter
            for name, which in (("pcie_tx", n.NVML_PCIE_UTIL_TX_BYTES),
                                ("pcie_rx", n.NVML_PCIE_UTIL_RX_BYTES)):
                value = self.call("nvmlDeviceGetPcieThroughput", h, which)
                if value is not None:
                    out[name] = float(value) * 1000.0
        if "nvlink_tx" not in out:
            out.update(self._nvlink(key, h, now))
        if "nvlink_tx" in out and "nvlink_rx" in out:
            out["nvlink_total"] = out["nvlink_tx"] + out["nvlink_rx"]
        return out

    def _gauge_is_mean(self, h: Any) -> bool:
        """Whether NVML's power gauge is a 1 s mean on this GPU: Ampere to the newest
        architecture these bindings name, GA100 aside (an unknown one: no)."""
        n, arch = self.nvml, self.call("nvmlDeviceGetArchitecture", h)
        return (arch is not None
                and n.NVML_DEVICE_ARCH_AMPERE <= arch <= n.NVML_DEVICE_ARCH_BLACKWELL
                and not GA100.search(str(self.call("nvmlDeviceGetName", h))))

    def _energy_power(self, key: str, h: Any, now: float) -> float | None:
        """Mean power (W) since the previous tick from the energy counter, or None."""
        mj = self.call("nvmlDeviceGetTotalEnergyConsumption", h)
        if mj is None:
            return None
        previous = self._energy_prev.get(key)
        self._energy_prev[key] = (now, float(mj))
        if previous is None or now <= previous[0] or mj <= previous[1]:
            return None  # first tick, no time passed, counter still or reset: the gauge
        return (float(mj) - previous[1]) / 1000.0 / (now - previous[0])

    def _gpm(self, key: str, h: Any) -> dict[str, float]:
        """Two GPM samples ≥ 100 ms apart (one tick) give activity over the interval."""
        previous = self.gpm[key]
        current = self.call("nvmlGpmSampleAlloc")
        if current is None or self.call("nvmlGpmSampleGet", h, current) is None:
            return {}
        result = self._gpm_metrics(previous, current)
        if result is None and any(name in GPM_CYCLE_METRICS for name in self.gpm_names):
            log.warning("the driver refuses GPM's cycle counters (metrics 248-250); reading "
                        "the other GPM metrics without them")
            self.gpm_names = [name for name in self.gpm_names if name not in GPM_CYCLE_METRICS]
            self._gpm_request = None  # built again for the shorter list
            result = self._gpm_metrics(previous, current)
        self.call("nvmlGpmSampleFree", previous)
        self.gpm[key] = current
        out: dict[str, float] = {}
        if result is None:
            return out
        metrics = result.metrics  # each attribute of pynvml's structs costs a Python call
        for i, name in enumerate(self.gpm_names):
            metric, scale = GPM_METRICS[name]
            m = metrics[i]
            ret, value = m.nvmlReturn, m.value
            if ret == 0 and value >= 0:
                value *= scale
                out[metric] = min(value, 1.0) if scale == 0.01 else value
        return out

    def _gpm_metrics(self, sample1: Any, sample2: Any) -> Any:
        """``nvmlGpmMetricsGet`` for ``gpm_names`` between two samples, or None. One
        request serves every GPU and tick (NVML writes each metric's result into it):
        every field of pynvml's structs is a Python call, and filling a new request
        each time was half the source's own CPU (8 GPUs: 2.1 → 1.2 ms a tick)."""
        n = self.nvml
        request = self._gpm_request
        if request is None:
            request = n.c_nvmlGpmMetricsGet_t()
            request.version = n.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self.gpm_names)
            metrics = request.metrics
            for i, name in enumerate(self.gpm_names):
                metrics[i].metricId = getattr(n, name)
            self._gpm_request = request
        request.sample1, request.sample2 = sample1, sample2
        return self.call("nvmlGpmMetricsGet", request)

    def _nvlink(self, key: str, h: Any, now: float) -> dict[str, float]:
        n = self.nvml
        values = self.call("nvmlDeviceGetFieldValues", h,
                           [n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                            n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX])
        if values is None or any(v.nvmlReturn != 0 for v in values):
            return {}
        tx, rx = (float(v.value.ullVal) for v in values)
        previous = self._nvlink_prev.get(key)
        self._nvlink_prev[key] = (now, tx, rx)
        if previous is None or now <= previous[0] or tx < previous[1] or rx < previous[2]:
            return {}
        dt = now - previous[0]
        return {"nvlink_tx": (tx - previous[1]) * KIB / dt,
                "nvlink_rx": (rx - previous[2]) * KIB / dt}

    def _xid_events(self) -> list[tuple[str, int]]:
        """XID events queued since the last tick, without blocking."""
        if self.events is None:
            return []
        found = []
        for _ in range(64):  # bounded: a storm of events cannot stall the tick
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.events, 0)
            except self.nvml.NVMLError:
                break  # NVML_ERROR_TIMEOUT: nothing (more) queued
            minor = self.call("nvmlDeviceGetMinorNumber", data.device)
            if minor is not None:
                found.append((str(minor), int(data.eventData)))
        return found

    def close(self) -> None:
        """Free GPM samples and the event set, shut NVML down."""
        for sample in self.gpm.values():
            self.call("nvmlGpmSampleFree", sample)
        if self.events is not None:
            self.call("nvmlEventSetFree", self.events)
        self.call("nvmlShutdown")
