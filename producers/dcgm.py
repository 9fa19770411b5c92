"""Readings scraped from an existing dcgm-exporter's ``/metrics``.

Many clusters already run NVIDIA's dcgm-exporter, which holds the profiling
counters pre-Hopper GPUs only expose through DCGM. What it really exports, and how
this source reads it:

- **Parsing** is prometheus_client's text parser (a maintained one), not a regex,
  over the whole page; it refuses a whole page for one bad line (a value such as
  ``ERROR - FAILED TO CONVERT TO STRING``, which exporters serve for array fields),
  so a page it refuses is parsed again line by line with the same parser. A line
  that still does not parse is skipped, counted per field (``skipped``) and logged
  once per field; the rest of the page is read. Only a body that is not text (NUL
  bytes) fails the scrape.
- **DCGM's blank values are absent readings.** DCGM exports "no value" (blank, not
  found, not supported, not permissioned) as sentinels: ``DCGM_INT32_BLANK``
  0x7ffffff0 (2147483632) and up, ``DCGM_INT64_BLANK`` 0x7ffffffffffffff0 and up,
  ``DCGM_FP64_BLANK`` 2**47 (140737488355328.0) and up (``dcgm_structs.h``'s
  ``*_IS_BLANK`` tests are ``>=``). A field whose real values stay far below 2**31
  (temperatures, clocks, counts, flags, MiB, W) is blank from 2147483632 up; a
  field whose real values can pass 2**31 (energy in mJ, byte and cycle rates) from
  2**47 up, which covers the int64 sentinels too. A blank is skipped and counted
  (reason ``blank``), never published.
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
- **Energy gives power.** ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since the
  driver loaded) is a counter, so the energy between two of its changes divided by
  the time between them is the exact mean power over that span, where
  ``DCGM_FI_DEV_POWER_USAGE`` is one instant. Only a span between two changes the
  agent saw counts (the first change may close a span the agent did not watch from
  its start); between changes the last mean holds, and ``power`` is the gauge until
  there is a mean.
- **Clock events feed ``throttle``.** ``DCGM_EXP_CLOCK_EVENTS_COUNT{clock_event=...}``
  counts clock events per reason; a reason whose count rose since the previous
  scrape sets its NVML clocks-event-reasons bit in ``throttle`` (OR-ed into the
  ``CLOCKS_EVENT_REASONS`` gauge where that is exported too).
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

from vigil_gpu_monitor.contracts.catalog import CATALOG, Kind, Scope
from vigil_gpu_monitor.producers.reading import Reading
from vigil_gpu_monitor.producers.xid import PendingXids

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
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gr_engine_active", 1.0),
    # an instantaneous rate in MB/s, whatever the CSV calls it (dcgm-exporter 4.9.0's
    # release notes: "NVLink throughput from MB/s to bytes per second")
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("nvlink_total", 1e6),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("pcie_replay", 1.0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped_rows_correctable", 1.0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped_rows_uncorrectable", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("row_remap_pending", 1.0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("row_remap_failure", 1.0),
}
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since the driver loaded: → power
CLOCK_EVENTS = "DCGM_EXP_CLOCK_EVENTS_COUNT"  # per clock_event reason: → throttle bits
# dcgm-exporter's clock_event label → NVML clocks-event-reason bit
# (nvmlClocksEventReason*, the same bits as DCGM_CLOCKS_THROTTLE_REASON_*)
CLOCK_EVENT_BITS = {"gpu_idle": 0x1, "clocks_setting": 0x2, "power_cap": 0x4,
                    "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal": 0x20,
                    "hw_thermal": 0x40, "hw_power_brake": 0x80, "display_clocks": 0x100}
# Every field the agent reads (the counters file Vigil ships must list each one).
READ_FIELDS = frozenset({*DCGM_FIELDS, ENERGY, CLOCK_EVENTS, "DCGM_FI_DEV_XID_ERRORS",
                         "DCGM_EXP_XID_ERRORS_COUNT"})
INT32_BLANK = 2147483632.0  # DCGM_INT32_BLANK; NOT_FOUND, NOT_SUPPORTED… are above it
FP64_BLANK = 140737488355328.0  # DCGM_FP64_BLANK (2**47); the int64 sentinels are above
# fields whose real values can pass 2**31: blank only from FP64_BLANK up
WIDE_FIELDS = frozenset({ENERGY, "DCGM_FI_PROF_NVLINK_TX_BYTES",
                         "DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES",
                         "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"})
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_PARSE_ERRORS = (ValueError, IndexError, KeyError, TypeError)
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
    energy_mj: dict[str, float] = field(default_factory=dict)  # GPU → energy counter
    clock_events: dict[tuple[str, str], float] = field(default_factory=dict)  # (GPU, reason)
    # (field, reason) → series skipped: ``unparsable`` line, DCGM ``blank``, ``nan``
    skipped: Counter[tuple[str, str]] = field(default_factory=Counter)


_Series = tuple[str, dict[str, str], float]  # (sample name, labels, value)


def _samples(text: str, skipped: Counter[tuple[str, str]]) -> list[_Series]:
    """Every sample of the page: the whole page through prometheus_client's parser,
    and where it refuses the page, each line through it on its own (so one bad line
    costs that line). Lines are parsed alone without their ``# TYPE``, which only
    names the type; nothing here needs it."""
    if "\x00" in text:
        raise ValueError("not exposition text (NUL bytes)")
    try:
        return [(s.name, s.labels, s.value)
                for family in text_string_to_metric_families(text) for s in family.samples]
    except _PARSE_ERRORS:
        pass
    out: list[_Series] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.extend((s.name, s.labels, s.value) for family in
                       text_string_to_metric_families(line + "\n") for s in family.samples)
        except _PARSE_ERRORS:
            match = _NAME.match(line)
            name = match.group(0) if match else ""
            # a DCGM field names its own count; anything else (an HTML error page, a
            # doc's "...") is "other", so garbage cannot grow the label set
            skipped[(name if name.startswith("DCGM_") else "other", "unparsable")] += 1
    return out


def _blank(name: str, value: float) -> bool:
    """Whether ``value`` is one of DCGM's blank / not-supported sentinels."""
    return value >= (FP64_BLANK if name in WIDE_FIELDS else INT32_BLANK)


def parse(text: str) -> Scrape:
    """Prometheus exposition text → a ``Scrape``; a line that does not parse is skipped
    and counted in ``Scrape.skipped``. ``ValueError`` only for a body that is not text."""
    out = Scrape()
    # (gpu, metric) → [(field, compute slices, value)], combined once all are read
    series: dict[tuple[str, str], list[tuple[str, int, float]]] = defaultdict(list)
    counts: dict[str, dict[tuple[str, int], float]] = {XID_TOTAL: {}, XID_COUNT: {}}
    for sample_name, labels, raw in _samples(text, out.skipped):
        # the parser appends a lower-case "_total" to counter samples; DCGM's upper-case
        # field names never end in one
        name = sample_name.removesuffix("_total")
        out.fields.add(name)
        out.counting = out.counting or name in counts
        value = float(raw)
        if not math.isfinite(value):
            out.skipped[(name, "nan")] += 1
            continue
        if _blank(name, value):
            out.skipped[(name, "blank")] += 1
            continue
        gpu = _gpu_of(labels)
        if gpu is None:
            continue
        if "UUID" in labels:
            out.uuids[gpu] = labels["UUID"]
        if "modelName" in labels:
            out.models.add(labels["modelName"])
        if name == ENERGY:
            out.energy_mj[gpu] = max(value, out.energy_mj.get(gpu, 0.0))  # one per MIG copy
        elif name == CLOCK_EVENTS:
            key_ev = (gpu, labels.get("clock_event", ""))
            out.clock_events[key_ev] = out.clock_events.get(key_ev, 0.0) + value
        elif name == XID_GAUGE:
            out.xid_gauge[gpu] = int(value)
        elif name in counts and labels.get("xid", "").isdigit():
            key = (gpu, int(labels["xid"]))
            counts[name][key] = counts[name].get(key, 0.0) + value
        elif name in DCGM_FIELDS:
            metric, scale = DCGM_FIELDS[name]
            if "GPU_I_ID" in labels:
                out.mig.add(gpu)
            series[(gpu, metric)].append(
                (name, _slices(labels.get("GPU_I_PROFILE", "")), max(0.0, value * scale)))
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


class _EnergyPower:
    """Mean power from an energy counter: the energy between two changes of the
    counter over the time between them. The exporter refreshes the counter at its own
    interval (30 s by default), so a change, not a tick, closes a span; the first
    change after the agent starts only opens one (its start is unknown)."""

    def __init__(self) -> None:
        self._first: dict[str, float] = {}  # GPU → the counter when first seen
        self._last: dict[str, tuple[float, float]] = {}  # GPU → (mJ, when it changed)
        self._power: dict[str, float] = {}

    def update(self, energy_mj: dict[str, float], now: float) -> dict[str, float]:
        """GPU → mean power (W) over its last closed span, for GPUs that have one."""
        for gpu, mj in energy_mj.items():
            first = self._first.setdefault(gpu, mj)
            last = self._last.get(gpu)
            if last is None:
                if mj != first:
                    self._last[gpu] = (mj, now)
                continue
            if mj == last[0]:
                continue
            if mj > last[0] and now > last[1]:
                self._power[gpu] = (mj - last[0]) / 1000.0 / (now - last[1])
            else:  # the counter went back (driver reload): start again
                self._power.pop(gpu, None)
            self._last[gpu] = (mj, now)
        return {g: p for g, p in self._power.items() if g in energy_mj}


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
        # (field, reason) → series skipped since start; logged once per field
        self.skipped: Counter[tuple[str, str]] = Counter()
        self._energy = _EnergyPower()
        self._clock_events: dict[tuple[str, str], float] = {}

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
        self._count_skipped(scrape)
        self._warn_missing(scrape)
        self.xids.update(scrape)
        for gpu, power in self._energy.update(scrape.energy_mj, now).items():
            scrape.gpus.setdefault(gpu, {})["power"] = power
        for gpu, bits in self._clock_event_bits(scrape).items():
            metrics = scrape.gpus.setdefault(gpu, {})
            metrics["throttle"] = float(int(metrics.get("throttle", 0.0)) | bits)
        reading = Reading(gpus=scrape.gpus)
        for gpu, metrics in reading.gpus.items():
            metrics["xid"] = float(self.pending.pop(gpu))
        reading.meta["gpu_uuids"] = dict(sorted(scrape.uuids.items()))
        reading.meta["gpu_models"] = sorted(scrape.models)
        if self.xids.history:
            reading.meta["xid_history"] = dict(sorted(self.xids.history.items()))
        return reading

    def _count_skipped(self, scrape: Scrape) -> None:
        for (name, reason), count in scrape.skipped.items():
            if not any(f == name for f, _ in self.skipped):  # once per field
                log.warning("dcgm-exporter at %s: %s series of %s skipped (%s), the rest of "
                            "the page read; counted in vigil_agent_series_skipped_total",
                            self.url, count, name, reason)
            self.skipped[(name, reason)] += count

    def _clock_event_bits(self, scrape: Scrape) -> dict[str, int]:
        """GPU → the NVML clocks-event-reason bits whose event count rose since the
        previous scrape (a first sight is a baseline; a fall is the window moving)."""
        bits: dict[str, int] = defaultdict(int)
        for (gpu, reason), count in scrape.clock_events.items():
            before = self._clock_events.get((gpu, reason))
            if before is not None and count > before and reason in CLOCK_EVENT_BITS:
                bits[gpu] |= CLOCK_EVENT_BITS[reason]
        self._clock_events = dict(scrape.clock_events)
        return bits

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
