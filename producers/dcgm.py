"""Readings scraped from an existing dcgm-exporter's ``/metrics``.

Many clusters already run NVIDIA's dcgm-exporter, which holds the profiling
counters pre-Hopper GPUs only expose through DCGM. What it really exports, and how
this source reads it:

- **Parsing** is prometheus_client's text parser (a maintained one), not a regex. A
  scrape it refuses is counted and logged, and that tick has no GPU readings.
- **The GPU** is the ``minor_number`` label where an exporter adds one, else ``gpu``
  (DCGM's GPU id), else the digits of ``device`` (``nvidia3``). ``Hostname`` /
  ``hostname``, ``UUID``, ``pci_bus_id`` and ``modelName`` vary across versions and
  are not needed to place a reading; ``UUID`` and ``modelName`` go to ``meta``.
- **MIG.** A GPU in MIG mode exports one series per GPU instance (``GPU_I_ID``,
  ``GPU_I_PROFILE``). No series overwrites another: profiling ratios (``DCGM_FI_PROF_*``
  activity) become the mean over the instances weighted by their compute slices (the
  ``3`` of ``3g.40gb``), profiling byte rates are summed, and device-level fields
  (``DCGM_FI_DEV_*``: clocks, power, ECC…) are the same physical value repeated per
  instance, so their largest copy is kept.
- **Profiling fields are often missing** (DCGM's profiling module "not loaded", or
  left out of the counters CSV). They are then absent, never zero, and one warning
  names them and the fix; it is repeated only when the set of missing fields changes.
- **The XID gauge is not an event.** ``DCGM_FI_DEV_XID_ERRORS`` holds the last XID the
  GPU ever had and is reset only when the exporter restarts (NVIDIA/dcgm-exporter#500,
  #190; NVIDIA/DCGM#277). ``XidWatch`` turns the XID series into events; see there.
"""

from __future__ import annotations

import logging
import math
import re
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from contracts.catalog import CATALOG, Kind, Scope
from producers.reading import Reading
from producers.xid import PendingXids

log = logging.getLogger(__name__)

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
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle", 1.0),
}
# The profiling fields Vigil's window detectors read (straggler: SM, tensor and DRAM
# activity; hang and links: NVLink traffic); a missing one is worth a warning. The
# FP pipes and occupancy are read when exported, and their absence is not.
PROFILING_FIELDS = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                    "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES")
XID_GAUGE = "DCGM_FI_DEV_XID_ERRORS"  # the last XID ever seen (not an event)
XID_TOTAL = "DCGM_EXP_XID_ERRORS_TOTAL"  # events per (GPU, xid) since the exporter started
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"  # events per (GPU, xid) within a sliding window
_KIND = {m.name: m.kind for m in CATALOG if m.scope is Scope.GPU}
_SLICES = re.compile(r"^(\d+)g\.")
MAX_EVENTS_PER_RISE = 8  # a counter jump larger than this is published as this many


@dataclass
class Scrape:
    """One exposition, read: catalog values per GPU and the raw XID series."""

    gpus: dict[str, dict[str, float]] = field(default_factory=dict)
    xid_gauge: dict[str, int] = field(default_factory=dict)
    # (gpu, xid) → events: from XID_TOTAL when exported, else XID_COUNT
    xid_counts: dict[tuple[str, int], float] = field(default_factory=dict)
    counting: bool = False  # the exporter exports XID_TOTAL or XID_COUNT
    fields: set[str] = field(default_factory=set)
    uuids: dict[str, str] = field(default_factory=dict)
    models: set[str] = field(default_factory=set)
    mig: set[str] = field(default_factory=set)


def parse(text: str) -> Scrape:
    """Prometheus exposition text → a ``Scrape``; ``ValueError`` if it is not valid
    exposition text."""
    out = Scrape()
    # (gpu, metric) → [(field, compute slices, value)], combined once all are read
    series: dict[tuple[str, str], list[tuple[str, int, float]]] = defaultdict(list)
    counts: dict[str, dict[tuple[str, int], float]] = {XID_TOTAL: {}, XID_COUNT: {}}
    for family in text_string_to_metric_families(text):
        if family.name in counts:
            out.counting = True
        for s in family.samples:
            # the parser appends a lower-case "_total" to counter samples; DCGM's upper-case
            # field names never end in one
            name = s.name.removesuffix("_total")
            out.fields.add(name)
            gpu = _gpu_of(s.labels)
            value = float(s.value)
            if gpu is None or not math.isfinite(value):
                continue
            if "UUID" in s.labels:
                out.uuids[gpu] = s.labels["UUID"]
            if "modelName" in s.labels:
                out.models.add(s.labels["modelName"])
            if name == XID_GAUGE:
                out.xid_gauge[gpu] = int(value)
            elif name in counts and s.labels.get("xid", "").isdigit():
                key = (gpu, int(s.labels["xid"]))
                counts[name][key] = counts[name].get(key, 0.0) + value
            elif name in DCGM_FIELDS:
                metric, scale = DCGM_FIELDS[name]
                if "GPU_I_ID" in s.labels:
                    out.mig.add(gpu)
                series[(gpu, metric)].append(
                    (name, _slices(s.labels.get("GPU_I_PROFILE", "")), max(0.0, value * scale)))
    out.xid_counts = counts[XID_TOTAL] or counts[XID_COUNT]
    for (gpu, metric), found in series.items():
        out.gpus.setdefault(gpu, {})[metric] = _combine(metric, found)
    return out


def _gpu_of(labels: dict[str, str]) -> str | None:
    for name in ("minor_number", "gpu"):
        value = labels.get(name, "")
        if value.isdigit():
            return value
    device = labels.get("device", "")
    return device[len("nvidia"):] if device.startswith("nvidia") and device[6:].isdigit() \
        else None


def _slices(profile: str) -> int:
    match = _SLICES.match(profile)
    return int(match.group(1)) if match else 1


def _combine(metric: str, found: list[tuple[str, int, float]]) -> float:
    """One value from every series of one GPU metric (several under MIG)."""
    if len(found) == 1:
        return found[0][2]
    if all(f.startswith("DCGM_FI_PROF_") for f, _, _ in found):
        if _KIND.get(metric) is Kind.RATIO:
            weight = sum(w for _, w, _ in found)
            return sum(w * v for _, w, v in found) / weight
        return sum(v for _, _, v in found)
    return max(v for _, _, v in found)


class XidWatch:
    """XID events from dcgm-exporter's XID series, as seen while the agent watches.

    - What an exporter shows when a GPU is first seen (agent start or restart, or a
      GPU that appears later) is history: it is kept in ``history`` as context and
      never becomes an event, so it cannot page anyone or drain a node.
    - When the exporter exports ``DCGM_EXP_XID_ERRORS_TOTAL`` (events per xid since it
      started) or ``DCGM_EXP_XID_ERRORS_COUNT`` (events per xid within its window,
      NVIDIA/dcgm-exporter#239), a rise of a series is that many events, so the same
      XID twice in a row is two events; a fall (the window moved on, or the exporter
      restarted) is none.
    - Otherwise only the last-XID gauge is there: a change of its value to another
      non-zero code is one event. The same code twice in a row cannot be seen from it,
      and a change to 0 is the exporter restarting, not an event.

    Once either count metric has been seen, the gauge is used for history only: both
    change on the same event.
    """

    def __init__(self, pending: PendingXids) -> None:
        self.pending = pending
        self.history: dict[str, int] = {}
        self.counting = False
        self._gauge: dict[str, int] = {}
        self._counts: dict[tuple[str, int], float] = {}
        self._known: set[str] = set()

    def update(self, scrape: Scrape) -> None:
        """Queue the XID events this scrape shows since the previous one."""
        self.counting = self.counting or scrape.counting
        new_gpus = {*scrape.gpus, *scrape.xid_gauge} - self._known
        for gpu in sorted(new_gpus):
            code = scrape.xid_gauge.get(gpu, 0)
            if code:
                self.history[gpu] = code
                log.info("GPU %s: dcgm-exporter shows XID %d from before the agent watched "
                         "it; kept as history, not an event", gpu, code)
        if self.counting:
            for (gpu, xid), value in sorted(scrape.xid_counts.items()):
                if gpu in new_gpus:
                    continue
                rise = int(value - self._counts.get((gpu, xid), 0.0))
                for _ in range(min(rise, MAX_EVENTS_PER_RISE)):
                    self.pending.push(gpu, xid)
        else:
            for gpu, code in sorted(scrape.xid_gauge.items()):
                if gpu not in new_gpus and code and code != self._gauge.get(gpu, 0):
                    self.pending.push(gpu, code)
        self._known |= new_gpus
        self._gauge.update(scrape.xid_gauge)
        self._counts = dict(scrape.xid_counts)


class DcgmExporterSource:
    """Scrapes ``url`` (e.g. ``http://localhost:9400/metrics``) once per tick."""

    def __init__(self, url: str, timeout: float = 2.0,
                 fetch: Callable[[str, float], str] | None = None) -> None:
        self.url = url
        self.timeout = timeout
        self.fetch = fetch or _http_get
        self.errors: Counter[str] = Counter()
        self.pending = PendingXids()
        self.xids = XidWatch(self.pending)
        self._missing_warned: frozenset[str] | None = None
        self._failing: str | None = None

    def read(self, now: float) -> Reading:
        """One scrape: every GPU's catalog metrics, and at most one new XID per GPU."""
        try:
            scrape = parse(self.fetch(self.url, self.timeout))
        except OSError as exc:
            return self._failed("unreachable", exc)
        except ValueError as exc:
            return self._failed("unparsable", exc)
        if self._failing:
            log.info("dcgm-exporter at %s answers again", self.url)
            self._failing = None
        self._warn_missing(scrape)
        self.xids.update(scrape)
        reading = Reading(gpus=scrape.gpus)
        for gpu, metrics in reading.gpus.items():
            metrics["xid"] = float(self.pending.pop(gpu))
        reading.meta["gpu_uuids"] = dict(sorted(scrape.uuids.items()))
        reading.meta["gpu_models"] = sorted(scrape.models)
        if self.xids.history:
            reading.meta["xid_history"] = dict(sorted(self.xids.history.items()))
        return reading

    def _failed(self, kind: str, exc: Exception) -> Reading:
        self.errors[kind] += 1
        if self._failing != kind:  # once per outage, not on every scrape
            log.warning("dcgm-exporter at %s %s: %s (counted until it recovers)",
                        self.url, kind, exc)
            self._failing = kind
        return Reading()

    def _warn_missing(self, scrape: Scrape) -> None:
        if not scrape.gpus:
            return
        missing = frozenset(f for f in PROFILING_FIELDS if f not in scrape.fields)
        if missing == self._missing_warned:
            return
        self._missing_warned = missing
        if missing:
            log.warning(
                "dcgm-exporter at %s does not export %s: those readings are absent (not 0) "
                "and the straggler, hang and link detectors see less. Fix: list them in "
                "dcgm-exporter's counters CSV (-f, as in its dcp-metrics-included.csv); if "
                "its log says 'Not collecting DCP metrics', DCGM's profiling module did not "
                "load (unsupported GPU, or another profiler holds the counters).",
                self.url, ", ".join(sorted(missing)))


def _http_get(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode("utf-8", errors="replace"))
