"""Event-time windows of one job: per-bin means of every GPU and NIC metric.

Samples are appended to bins of ``bin_seconds`` while a bin is open; once the
watermark closes it, a bin keeps only its means, one numpy array per section, so the
window holds 8 bytes a reading whatever the agents' sampling rate. The whole state is
JSON-able for a Faust table's changelog. Absent readings stay absent (NaN), never 0.
"""

from __future__ import annotations

import base64
import functools
import math
import operator
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from vigil_gpu_monitor.contracts.catalog import GPU_METRICS, NIC_METRICS
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.detectors.held import HeldReadings
from vigil_gpu_monitor.detectors.robust import Array

# Codes and bitmasks have no meaningful mean: the health detector reads them per sample.
PER_SAMPLE_ONLY = {"xid", "throttle"}
ALL_GPU_METRICS = tuple(m for m in GPU_METRICS if m not in PER_SAMPLE_ONLY)
ALL_NIC_METRICS = tuple(NIC_METRICS)
# Link states keep the bin's best reading: a link that idles down to save power is back
# at full speed whenever it carries traffic, a degraded one never is.
BIN_MAX_METRICS = frozenset({"pcie_gen", "pcie_width", "ib_rate"})

Entity = tuple[str, str]  # (node, gpu index or NIC name)


WINDOW_LAYOUT = 5  # the layout of the state below; a checkpoint in another starts empty
# 3: each sealed bin listed its devices itself; 3 and 4: an open bin's entries were
# lists of numbers (None: no reading)
READABLE_LAYOUTS = (3, 4, WINDOW_LAYOUT)
# one device's values of the window's metrics, in order (a tuple from a full sample)
Readings = Sequence[float | None]
# node → section → device → its entries in the bin: float64 values packed end to end
RawBin = dict[str, dict[str, dict[str, bytearray]]]
_NO_READING = (math.nan,)  # what a metric not sent reads as (``_Pattern``)
MAX_PATTERNS = 256  # sets of sent keys whose reading ``add`` keeps (a section)


class SealedSection:
    """One section (GPUs or NICs) of a sealed bin: its devices, sorted, and their
    means as one (devices × metrics) array, NaN where nothing was read. Consecutive
    bins with the same devices share one device list."""

    __slots__ = ("devices", "means", "_set")

    def __init__(self, devices: list[Entity], means: Array,
                 device_set: frozenset[Entity] | None = None) -> None:
        self.devices = devices
        self.means = means
        self._set = device_set

    def device_set(self) -> frozenset[Entity]:
        """The devices as a set (built once; shared with the bins sharing the list)."""
        if self._set is None:
            self._set = frozenset(self.devices)
        return self._set

    def to_state(self, device_list: int) -> dict[str, Any]:
        """JSON-able: its device list's number in the checkpoint's ``device_lists``,
        and the means as base64 of their float64 bytes (exact, NaN kept, and encoded
        in C: a checkpoint must not cost a Python step per reading)."""
        return {"devices": device_list,
                "means": base64.b64encode(np.ascontiguousarray(self.means).tobytes()).decode()}

    @classmethod
    def from_state(cls, state: dict[str, Any], width: int,
                   device_lists: list[list[Entity]]) -> SealedSection:
        listed = state["devices"]
        devices = device_lists[listed] if isinstance(listed, int) else [
            (n, d) for n, d in listed]  # layout 3: listed in the bin itself
        means = np.frombuffer(base64.b64decode(state["means"]), dtype=np.float64)
        return cls(devices, means.reshape(len(devices), width))


class ViewLayout(NamedTuple):
    """Where each GPU of an evaluation sits: its node's index and its slot there;
    and each GPU's ``"node/gpu"`` key (kept with the layout: building 16,384 of them
    cost 3 ms of each step of such a job)."""

    gpus: list[Entity]
    nics: list[Entity]
    nodes: tuple[str, ...]
    node_idx: NDArray[np.int64]
    slot_idx: NDArray[np.int64]
    max_slots: int
    gpu_keys: list[str]


class _Ring:
    """A window's (metrics × devices × bins) means in ``2n`` columns for a window of
    ``n`` bins, each bin written once, at column ``b - first``: any ``n``
    consecutive bins held are one contiguous slice, so moving the window on writes
    only the new bins. When a bin would fall past the last column, the ``n - 1``
    bins before it are first copied to the front (``first`` moves on), once every
    ``n + 1`` bins. A bin's column is a strided write, an element a cache line;
    the copy moves whole rows of ``n - 1`` bins. Writing each bin at two slots
    instead cost two strided writes a bin (~30 ms each at 131,072 GPUs)."""

    def __init__(self, entities: list[Entity], bins: range, block: Array) -> None:
        self.entities = entities
        self.bins = bins
        self.first = bins.start  # the bin in column 0
        self.store = np.empty((*block.shape[:2], 2 * len(bins)))
        self.store[:, :, :len(bins)] = block

    def write(self, bins: range, columns: Array) -> None:
        """Store each of ``bins``' columns (metrics × devices)."""
        for j, b in enumerate(bins):
            self.write_bin(b, columns[:, :, j])

    def write_bin(self, b: int, column: Array) -> None:
        """Store bin ``b``'s column (metrics × devices): the newest bin of the next
        window, whose ``n - 1`` bins before it are held."""
        n = len(self.bins)
        if b - self.first >= self.store.shape[2]:
            kept = b - n + 1  # the next window's first bin
            self.store[:, :, :n - 1] = self.store[:, :, kept - self.first:b - self.first]
            self.first = kept
        self.store[:, :, b - self.first] = column

    def window(self) -> Array:
        """The current bins' means, oldest first (a view: the next ``write`` changes
        it)."""
        start = self.bins.start - self.first
        return self.store[:, :, start:start + len(self.bins)]


class JobWindow:
    """Binned readings of one job, in two stages.

    - Open bins (``open[b][node]['g'|'n'][dev]``): every sample's values of the
      window's metrics, in the window's metric order (NaN: no reading), packed as
      float64 onto the end of one ``bytearray`` per device and bin. A sample carrying
      every metric costs two C calls per device (``itemgetter``, ``struct.pack``);
      folding running sums reading by reading at ingest was most of the ingest cost
      (bench/RESULTS.md, "Replay speed"). Packed at once, the values are read back
      at the seal as one buffer: kept as Python floats until then, they were
      scattered over the heap, and turning them into an array cost 60-70 ns each,
      most of a large job's step (bench/RESULTS.md, issue #18, third session). A
      bytearray is also one object a device, where a list of tuples of floats was
      a dozen the garbage collector had to walk.
    - Sealed bins (``sealed[b][section]``, ``SealedSection``): each metric's mean over
      the bin (``BIN_MAX_METRICS``: the largest reading) as one numpy array per
      section, 8 bytes a reading. ``seal(b)`` turns an open bin into that once the
      watermark closed it.

    An evaluation reads (devices × bins) matrices (``matrices``); from one step to
    the next they are the last ones moved on by a column (``_Ring``), so a step costs
    what its newest bin costs. The state (``to_state``) is JSON-able for checkpoints.
    """

    def __init__(self, bin_seconds: float, state: dict[str, Any] | None = None,
                 gpu_metrics: tuple[str, ...] = ALL_GPU_METRICS,
                 nic_metrics: tuple[str, ...] = ALL_NIC_METRICS) -> None:
        self.bin_seconds = bin_seconds
        self.gpu_metrics = gpu_metrics
        self.nic_metrics = nic_metrics
        self.metrics = {"g": gpu_metrics, "n": nic_metrics}
        state = state or {}
        self.restored = (state.get("layout") in READABLE_LAYOUTS  # these metrics
                         and state.get("metrics") == {k: list(v)
                                                      for k, v in self.metrics.items()})
        self.open: dict[str, RawBin] = (_open_from_state(state["open"], state["layout"])
                                        if self.restored else {})
        # bins that shared a device list share it again (steps compare lists by identity)
        device_lists = [[(n, d) for n, d in listed]
                        for listed in state.get("device_lists", [])] if self.restored else []
        self.sealed: dict[str, dict[str, SealedSection]] = {
            b: {k: SealedSection.from_state(v, len(self.metrics[k]), device_lists)
                for k, v in bin_.items()}
            for b, bin_ in state["sealed"].items()} if self.restored else {}
        self._max_at = {k: [i for i, m in enumerate(v) if m in BIN_MAX_METRICS]
                        for k, v in self.metrics.items()}
        self._read_all = {k: _reader(v) for k, v in self.metrics.items()}
        self._pack = {k: _packer(len(v)) for k, v in self.metrics.items()}
        # a NaN (no reading) per metric: what a sample did not send reads as this
        self._gaps = {k: (math.nan,) * len(v) for k, v in self.metrics.items()}
        self._metric_at = {k: {m: i for i, m in enumerate(v)} for k, v in self.metrics.items()}
        # section → a device's sent keys (``HeldReadings.sent_keys``) → how to read
        # the window metrics of a sample sending the same ones (``add``)
        self._patterns: dict[str, dict[frozenset[str], _Pattern]] = {"g": {}, "n": {}}
        # derived, not persisted: the last sorted device list per section, and the
        # last settled window's block per section
        self._sorted: dict[str, tuple[frozenset[Entity], list[Entity]]] = {}
        # section → the last settled window's means (``matrices``)
        self._last: dict[str, _Ring] = {}
        # section → the last bin's devices placed in a window's devices (``_placement``)
        self._placed: dict[str, tuple[list[Entity], list[Entity], NDArray[np.intp],
                                      NDArray[np.intp]]] = {}
        self._layout: ViewLayout | None = None

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for a table or a checkpoint."""
        # consecutive bins share one device list: it is written once, not once a bin
        numbers: dict[int, int] = {}
        device_lists: list[list[Entity]] = []
        for sections in self.sealed.values():
            for part in sections.values():
                if id(part.devices) not in numbers:
                    numbers[id(part.devices)] = len(device_lists)
                    device_lists.append(part.devices)
        return {"layout": WINDOW_LAYOUT, "device_lists": device_lists,
                "metrics": {k: list(v) for k, v in self.metrics.items()},
                "open": _each_device(self.open, lambda e: base64.b64encode(e).decode()),
                "sealed": {b: {k: v.to_state(numbers[id(v.devices)])
                               for k, v in sections.items()}
                           for b, sections in self.sealed.items()}}

    def bin_of(self, ts: float) -> int:
        """The bin a timestamp falls in."""
        return math.floor(ts / self.bin_seconds)

    def add(self, sample: Sample, held: HeldReadings | None = None) -> None:
        """Append one validated sample to its open bin; with ``held``, the window
        metrics it lacks for a device it reports take their held values
        (``detectors/held.py`` says what is held and for how long), and the ones it
        has are remembered. The sample itself is not changed."""
        ts = sample["ts"]
        key = str(self.bin_of(ts))
        nodes = self.open.get(key)
        if nodes is None:
            nodes = self.open[key] = {}
        node_bin = nodes.get(sample["node"])
        if node_bin is None:
            node_bin = nodes[sample["node"]] = {"g": {}, "n": {}}
        mine = held.node(sample["node"], ts) if held is not None else None
        whole = held.sent_keys(sample["node"]) if held is not None else None
        for section, devices in (("g", sample["gpus"]), ("n", sample["nics"])):
            read_all = self._read_all[section]
            pack = self._pack[section]
            metrics, gaps = self.metrics[section], self._gaps[section]
            target = node_bin[section]
            kept = mine[section] if mine is not None else None
            sent_whole = whole[section] if whole is not None else None
            patterns = self._patterns[section]
            for dev, readings in devices.items():
                before = kept.get(dev) if kept is not None else None
                values: Readings | None = None
                if (before is not None and before[1] is None and ts >= before[2]
                        and (sent := sent_whole.get(dev)) is not None):  # type: ignore[union-attr]
                    # ``held.fill``'s usual case, inlined on purpose: in order, nothing
                    # held where the sample that last replaced the values whole sent
                    # nothing, and this one sends the same window metrics (its other
                    # keys do not matter to ``fill``): replace whole. Read in C, each
                    # step of ``_Pattern`` a KeyError or False where it sends others
                    how = patterns.get(sent)
                    if how is None:
                        how = self._pattern(section, sent)
                    if readings.keys().isdisjoint(how.absent):
                        try:
                            values = how.place(how.present(readings) + _NO_READING)
                        except KeyError:
                            pass
                        else:
                            kept[dev] = [values, None, ts]  # type: ignore[index]
                if values is None:
                    try:
                        values = read_all(readings)
                    except KeyError:  # some metric not sent: NaN, or a held value
                        values = tuple(map(readings.get, metrics, gaps))
                        if held is not None and kept is not None and sent_whole is not None:
                            values = held.fill(kept, sent_whole, dev, values,
                                               readings.keys(), ts)
                    else:
                        if kept is not None:
                            # ``held.remember``'s usual case (newer than all held:
                            # replace whole), inlined on purpose: 13.8 vs 14.8-15.1 µs
                            # a sample of ingest on the mixed trace; ``remember``
                            # stays the rule, and takes every late sample
                            if before is None or ts >= before[2]:
                                kept[dev] = [values, None, ts]
                            else:
                                held.remember(kept, dev, values, ts)  # type: ignore[union-attr]
                            if sent_whole:
                                sent_whole.pop(dev, None)
                packed = pack(*values)
                entries = target.get(dev)
                if entries is None:
                    target[dev] = bytearray(packed)
                else:
                    entries += packed

    def _pattern(self, section: str, sent: frozenset[str]) -> _Pattern:
        """How to read the section's window metrics from readings that send those
        of ``sent`` and no other (kept per set: held keeps each set once, at most
        ``MAX_PATTERNS`` of them here)."""
        patterns = self._patterns[section]
        if len(patterns) >= MAX_PATTERNS:
            patterns.clear()
        metrics = self.metrics[section]
        present = [m for m in metrics if m in sent]
        # the present values, then one NaN: each metric's slot in that tuple
        slots = [present.index(m) if m in sent else len(present) for m in metrics]
        how = patterns[sent] = _Pattern(_tuple_getter(present),
                                        frozenset(m for m in metrics if m not in sent),
                                        _tuple_getter(slots))
        return how

    def seal(self, b: int) -> None:
        """Bin ``b`` is closed: keep only its means (no sample may enter it after)."""
        raw = self.open.pop(str(b), None)
        if raw is None:
            return
        self.sealed[str(b)] = {section: self._seal_section(section, raw, b)
                               for section in ("g", "n")}
        for section, ring in list(self._last.items()):
            if ring.bins and b <= ring.bins[-1]:  # kept as empty, it now holds data
                del self._last[section]

    def first_bin_from(self, b: int) -> int | None:
        """The first bin at or after ``b`` that holds data (None: none does)."""
        return min((int(k) for k in (*self.open, *self.sealed) if int(k) >= b), default=None)

    def drop_before(self, first_bin: int) -> None:
        """Forget bins older than ``first_bin`` (bounded memory)."""
        for bins in (self.open, self.sealed):
            for key in [k for k in bins if int(k) < first_bin]:
                del bins[key]

    def entities(self, section: str, bins: range) -> list[Entity]:
        """Every (node, device) seen in ``bins``, sorted for determinism (the last
        answer is kept: from one step to the next it rarely changes)."""
        parts = [self._section(section, b) for b in bins]
        # bins sharing a device list share its set: each distinct set is joined once
        # (a node gone silent in the window gives the bins since two lists, where
        # joining each bin's set cost 30 ms a step of a 131,072-GPU job)
        distinct = list({id(p.devices): p for p in parts if p.devices}.values())
        if len(distinct) == 1:  # the usual case: one list
            found = distinct[0].device_set()
        else:
            found = frozenset().union(*(p.device_set() for p in distinct))
        last = self._sorted.get(section)
        if last is None or (last[0] is not found and last[0] != found):
            last = self._sorted[section] = (found, _sorted_devices(found))
        return list(last[1])

    def layout(self, gpus: list[Entity], nics: list[Entity]) -> ViewLayout:
        """The nodes of these devices, sorted, and each GPU's (node index, slot); the
        last answer is kept, as the devices rarely change from one step to the next."""
        last = self._layout
        if last is not None and last.gpus == gpus and last.nics == nics:
            return last
        nodes = sorted({n for n, _ in gpus} | {n for n, _ in nics})
        node_of = {n: i for i, n in enumerate(nodes)}
        slots: dict[str, int] = {}
        node_idx = np.empty(len(gpus), dtype=np.int64)
        slot_idx = np.empty(len(gpus), dtype=np.int64)
        for i, (node, _) in enumerate(gpus):
            node_idx[i] = node_of[node]
            slot_idx[i] = slots.get(node, 0)
            slots[node] = slot_idx[i] + 1
        node_idx.flags.writeable = slot_idx.flags.writeable = False
        self._layout = ViewLayout(list(gpus), list(nics), tuple(nodes), node_idx, slot_idx,
                                  max(slots.values(), default=0),
                                  [f"{node}/{gpu}" for node, gpu in gpus])
        return self._layout

    def means(self, section: str, b: int, metrics: tuple[str, ...]
              ) -> dict[Entity, list[float | None]]:
        """Each device's means of ``metrics`` in bin ``b`` (None: no reading)."""
        part = self._section(section, b)
        at = [self.metrics[section].index(m) if m in self.metrics[section] else None
              for m in metrics]
        return {e: [None if i is None or row[i] != row[i] else row[i] for i in at]
                for e, row in zip(part.devices, part.means.tolist(), strict=True)}

    def matrices(self, section: str, metrics: tuple[str, ...], entities: list[Entity],
                 bins: range) -> dict[str, Array]:
        """Metric → (entities × bins) means; NaN where nothing was read. Read-only
        arrays, valid until the next call for this section.

        A settled window (every bin sealed or empty) is kept in a ring of twice its
        bins (``_Ring``): the next step's window (a bin on, the same devices) costs
        writing the new bin's column, where shifting a copied block cost 5 ms a step
        of a 16,384-GPU job."""
        settled = not any(str(b) in self.open for b in bins)  # sealed or empty: final
        ring = self._last.get(section)
        shift = bins.start - ring.bins.start if ring is not None else -1
        if (settled and ring is not None and ring.entities == entities
                and len(ring.bins) == len(bins) and 0 <= shift < len(bins)):
            for b in bins[len(bins) - shift:]:
                part = self._section(section, b)
                if part.devices == entities:  # the usual bin: its means as they are
                    ring.write_bin(b, part.means.T)
                else:
                    ring.write(range(b, b + 1), self._block(section, entities,
                                                            range(b, b + 1)))
            ring.bins = bins
            block = ring.window()
        elif settled:
            ring = self._last[section] = _Ring(list(entities), bins,
                                               self._block(section, entities, bins))
            block = ring.window()
        else:
            block = self._block(section, entities, bins)
        block.flags.writeable = False
        at = self._metric_at[section]
        return {m: block[at[m]] if m in at else np.full((len(entities), len(bins)), np.nan)
                for m in metrics}

    def _block(self, section: str, entities: list[Entity], bins: range) -> Array:
        """(the section's metrics × entities × bins) means, built bin by bin."""
        block = np.full((len(self.metrics[section]), len(entities), len(bins)), np.nan)
        for j, b in enumerate(bins):
            part = self._section(section, b)
            if part.devices == entities:
                block[:, :, j] = part.means.T
            elif part.devices:
                to, of = self._placement(section, part.devices, entities)
                if len(to):
                    block[:, to, j] = part.means[of].T
        return block

    def _placement(self, section: str, devices: list[Entity], entities: list[Entity]
                   ) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
        """The rows of ``entities`` that a bin of ``devices`` fills, and the rows of
        ``devices`` that fill them. The last answer per section is kept:
        consecutive bins share a device list, so a node gone silent costs a lookup
        per device once, not a dict of the bin's devices and a lookup per entity
        each step (100 ms a bin of a 131,072-GPU job)."""
        last = self._placed.get(section)
        if last is not None and last[0] is devices and last[1] == entities:
            return last[2], last[3]
        index = {e: i for i, e in enumerate(entities)}
        rows = np.fromiter((index.get(e, -1) for e in devices), dtype=np.intp,
                           count=len(devices))
        of = np.flatnonzero(rows >= 0)
        to = rows[of]
        self._placed[section] = (devices, list(entities), to, of)
        return to, of

    def _section(self, section: str, b: int) -> SealedSection:
        """Bin ``b``'s section, sealed (an open bin's is computed, not kept)."""
        sealed = self.sealed.get(str(b))
        if sealed is not None:
            return sealed[section]
        raw = self.open.get(str(b))
        if raw is None:
            return _empty_section(len(self.metrics[section]))
        return self._seal_section(section, raw, b)

    def _seal_section(self, section: str, raw: RawBin, b: int) -> SealedSection:
        width = len(self.metrics[section])
        before = self.sealed.get(str(b - 1), {}).get(section)
        # the usual case: the bin holds the previous bin's devices, as many and every
        # one of them, so that list is shared (not built and sorted again)
        if before is not None and len(before.devices) == sum(
                len(data[section]) for data in raw.values()):
            try:
                stacks = [raw[node][section][dev] for node, dev in before.devices]
            except KeyError:
                pass
            else:
                return SealedSection(before.devices, self._bin_means(section, stacks, width),
                                     before.device_set())
        devices = _sorted_devices((node, dev) for node, data in raw.items()
                                  for dev in data[section])
        stacks = [raw[node][section][dev] for node, dev in devices]
        return SealedSection(devices, self._bin_means(section, stacks, width))

    def _bin_means(self, section: str, stacks: list[bytearray], width: int) -> Array:
        """(devices × metrics): each metric's mean over each device's entries in one
        bin (``BIN_MAX_METRICS``: the largest), NaN where it has no reading.

        The devices' packed entries, joined, are one (devices × entries × metrics)
        array, a device with fewer entries padded with NaN, and are reduced along
        the entries: a handful of numpy calls per bin and section. The entries are
        added one after another, in arrival order, as Python's ``sum`` did, so the
        means are the same to the last bit (``reduceat`` is not: it sums in another
        order; so may ``sum(axis=1)`` where the metrics are one column)."""
        if not stacks or not width:
            return np.full((len(stacks), width), np.nan)
        row = width * 8
        sizes = list(map(len, stacks))
        full = max(sizes)
        deepest = full // row
        if sizes.count(full) != len(sizes):  # pad the shorter ones with NaN entries
            stacks = [s if len(s) == full else s + _nan_row(width) * ((full - len(s)) // row)
                      for s in stacks]
        cube = np.frombuffer(b"".join(stacks), dtype=np.float64).reshape(
            len(stacks), deepest, width)
        if deepest == 1:  # one entry each: the entries are the means
            return cube[:, 0]
        absent = np.isnan(cube)
        if not absent.any():  # every entry read every metric: plain sums
            means = _sum_entries(cube)
            means /= float(deepest)
        else:
            with np.errstate(invalid="ignore"):
                means = (_sum_entries(np.where(absent, 0.0, cube))
                         / _sum_entries(~absent, np.float64))
        maxed = self._max_at[section]
        if maxed:
            means[:, maxed] = functools.reduce(
                np.fmax, [cube[:, i, maxed] for i in range(deepest)])
        return means


class _Pattern(NamedTuple):
    """Reading a section's window metrics in C from readings that send a known set
    of them: ``place(present(readings) + _NO_READING)`` is the window's values, NaN
    where nothing was sent, the same tuple as ``map(readings.get, metrics, gaps)``
    gives. ``present`` raises KeyError where one of its metrics is not sent;
    ``absent``: the window metrics that must not be sent either."""

    present: Callable[[Any], tuple[Any, ...]]
    absent: frozenset[str]
    place: Callable[[tuple[Any, ...]], Readings]


def _tuple_getter(keys: Sequence[Any]) -> Callable[[Any], tuple[Any, ...]]:
    """``itemgetter(*keys)``, a tuple whatever the number of keys."""
    if len(keys) >= 2:
        return operator.itemgetter(*keys)
    if keys:
        one = operator.itemgetter(keys[0])
        return lambda values: (one(values),)
    return lambda values: ()


def _sum_entries(cube: Array, dtype: type | None = None) -> Array:
    """(devices × entries × metrics) → (devices × metrics): the entries added one
    after another, in arrival order. A copy and one in-place add an entry: 2.6x
    faster than ``sum(axis=1)`` (a reduction along a middle axis), and the same
    order, so the same bits."""
    total = cube[:, 0].astype(dtype or cube.dtype)
    for i in range(1, cube.shape[1]):
        total += cube[:, i]
    return total


@functools.cache
def _packer(width: int) -> Callable[..., bytes]:
    """``pack(*values)``: ``width`` numbers as native float64 bytes (``struct``, in C;
    ``struct.error`` on a value that is not a number)."""
    return struct.Struct(f"@{width}d").pack


@functools.cache
def _nan_row(width: int) -> bytes:
    """One entry of ``width`` NaN values, packed."""
    return _packer(width)(*[math.nan] * width)


def _pack_gaps(pack: Callable[..., bytes], values: Readings) -> bytes:
    """``values`` packed, None (no reading) as NaN."""
    return pack(*[math.nan if v is None else v for v in values])


def _each_device(open_bins: dict[str, Any], convert: Callable[[Any], Any]) -> dict[str, Any]:
    """Open bins (bin → node → section → device → entries) with each device's entries
    converted."""
    return {b: {node: {section: {dev: convert(entries) for dev, entries in devices.items()}
                       for section, devices in data.items()}
                for node, data in nodes.items()}
            for b, nodes in open_bins.items()}


def _open_from_state(stored: dict[str, Any], layout: int) -> dict[str, RawBin]:
    """Open bins from a checkpoint: each device's entries as base64 of their packed
    values, or (layouts 3 and 4) as lists of numbers with None for no reading."""
    if layout >= 5:
        return _each_device(stored, lambda e: bytearray(base64.b64decode(e)))
    return _each_device(stored, lambda entries: bytearray(b"".join(
        _pack_gaps(_packer(len(e)), e) for e in entries)))


def _reader(metrics: tuple[str, ...]) -> Callable[[dict[str, float]], Readings]:
    """Readings → their values of ``metrics`` as a tuple, in C (``itemgetter``: 2.5x
    faster than a ``map`` into a list); KeyError when one is missing."""
    if len(metrics) == 1:
        one = operator.itemgetter(metrics[0])
        return lambda readings: (one(readings),)
    if not metrics:
        return lambda readings: ()
    return operator.itemgetter(*metrics)


@functools.cache
def _empty_section(width: int) -> SealedSection:
    """A bin with no devices (shared: never changed)."""
    return SealedSection([], np.empty((0, width)))


def _sorted_devices(found: Iterable[Entity]) -> list[Entity]:
    return sorted(found, key=lambda e: (e[0], _device_order(e[1])))


def _device_order(dev: str) -> tuple[int, str]:
    return (int(dev), "") if dev.isdigit() else (1 << 30, dev)


class WindowView:
    """One evaluation's arrays: every windowed metric for every GPU and NIC, built once.

    ``gpu(m)`` is (GPUs × bins); ``per_node(m)`` is (nodes × GPU slots × bins), NaN
    padded, for comparing the GPUs of each node with each other.
    """

    def __init__(self, window: JobWindow, bins: range) -> None:
        self.bins = bins
        self.sealed = frozenset(b for b in bins if str(b) in window.sealed)  # final means
        self.bin_seconds = window.bin_seconds
        self.gpus = window.entities("g", bins)
        self.nics = window.entities("n", bins)
        self._gpu = window.matrices("g", window.gpu_metrics, self.gpus, bins)
        self._nic = window.matrices("n", window.nic_metrics, self.nics, bins)
        layout = window.layout(self.gpus, self.nics)
        self.nodes = list(layout.nodes)
        self.gpu_keys = layout.gpu_keys  # "node/gpu", in ``gpus`` order (shared: do not modify)
        self._node_idx, self._slot_idx = layout.node_idx, layout.slot_idx
        self.max_slots = layout.max_slots
        self._cubes: dict[tuple[str, int | None], Array] = {}

    def gpu(self, metric: str) -> Array:
        """(GPUs × bins) means of one GPU metric."""
        return self._gpu[metric]

    def nic(self, metric: str) -> Array:
        """(NICs × bins) means of one NIC metric."""
        return self._nic[metric]

    def per_node(self, metric: str, last: int | None = None) -> Array:
        """(nodes × GPU slots × bins) means of one GPU metric, NaN padded (shared: do
        not modify); with ``last``, only the newest ``last`` bins (a check of the
        last few bins need not lay out the whole window: 8 MB at 16,384 GPUs)."""
        cube = self._cubes.get((metric, last))
        if cube is None:
            values = self._gpu[metric] if last is None else self._gpu[metric][:, -last:]
            cube = np.full((len(self.nodes), self.max_slots, values.shape[1]), np.nan)
            cube[self._node_idx, self._slot_idx] = values
            self._cubes[(metric, last)] = cube
        return cube

    def latest_per_node(self, metrics: tuple[str, ...]) -> Array:
        """(metrics × nodes × GPU slots): the newest bin's means, NaN padded."""
        out = np.full((len(metrics), len(self.nodes), self.max_slots), np.nan)
        out[:, self._node_idx, self._slot_idx] = [self._gpu[m][:, -1] for m in metrics]
        return out

    def activity(self) -> Array:
        """(GPUs × bins) SM activity, or, where no GPU of the view reports it
        (dcgm-exporter's default fields since 4.0 leave it out), tensor activity in
        its place: both are near zero on a GPU that spins in a collective or idles,
        and well above it on one that computes. Detectors that only ask "is it
        computing?" read this."""
        metric = self.activity_metric()
        if metric is None:
            return np.full((len(self.gpus), len(self.bins)), np.nan)
        return self._gpu[metric]

    def activity_metric(self) -> str | None:
        """The metric ``activity`` reads (None: neither is in the window)."""
        sm = self._gpu.get("sm_active")
        if sm is not None and not np.isnan(sm).all():
            return "sm_active"
        return "tensor_active" if "tensor_active" in self._gpu else None

    def positions(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Each GPU's (node index, slot) in ``per_node`` arrays, in ``gpus`` order."""
        return self._node_idx, self._slot_idx

    def gpus_per_node(self) -> dict[str, int]:
        """How many GPUs each node has in the view."""
        counts = np.bincount(self._node_idx, minlength=len(self.nodes))
        return dict(zip(self.nodes, counts.tolist(), strict=True))

    def gpu_at(self, node_index: int, slot: int) -> Entity:
        """The (node, gpu) entity at a position of ``per_node`` arrays."""
        mask = (self._node_idx == node_index) & (self._slot_idx == slot)
        return self.gpus[int(np.argmax(mask))]

    def bin_start(self, offset_from_end: int, of: int) -> float:
        """Event time at which bin ``offset_from_end`` of the last ``of`` bins begins."""
        return (self.bins[-1] - of + 1 + offset_from_end) * self.bin_seconds
