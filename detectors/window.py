"""Event-time windows of one job: per-bin means of every GPU and NIC metric.

Samples are folded into bins of ``bin_seconds`` as running sums, so a window costs
the same whatever the agents' sampling rate, and the whole state is a JSON-able
dict that a Faust table can changelog. Absent readings stay absent (NaN), never 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from contracts.catalog import GPU_METRICS, NIC_METRICS
from contracts.messages import Sample
from detectors.held import HeldReadings
from detectors.robust import Array

# Codes and bitmasks have no meaningful mean: the health detector reads them per sample.
PER_SAMPLE_ONLY = {"xid", "throttle"}
ALL_GPU_METRICS = tuple(m for m in GPU_METRICS if m not in PER_SAMPLE_ONLY)
ALL_NIC_METRICS = tuple(NIC_METRICS)
# Link states keep the bin's best reading: a link that idles down to save power is back
# at full speed whenever it carries traffic, a degraded one never is.
BIN_MAX_METRICS = frozenset({"pcie_gen", "pcie_width", "ib_rate"})

Entity = tuple[str, str]  # (node, gpu index or NIC name)


class JobWindow:
    """Binned readings of one job; ``bins[b][node]['g'|'n'][dev][metric] = [sum, count]``
    (``[max, 1]`` for ``BIN_MAX_METRICS``), so ``sum / count`` is the bin's value."""

    def __init__(self, bin_seconds: float, state: dict[str, Any] | None = None,
                 gpu_metrics: tuple[str, ...] = ALL_GPU_METRICS,
                 nic_metrics: tuple[str, ...] = ALL_NIC_METRICS) -> None:
        self.bin_seconds = bin_seconds
        self.gpu_metrics = gpu_metrics
        self.nic_metrics = nic_metrics
        self.bins: dict[str, dict[str, Any]] = (state or {}).get("bins", {})
        # (section, bin) → (entities, metric → column): sealed bins never change, so their
        # columns are built once. Derived data: not part of the persisted state.
        self._columns: dict[tuple[str, int], tuple[list[Entity], dict[str, Array]]] = {}

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for a table or a checkpoint."""
        return {"bins": self.bins}

    def bin_of(self, ts: float) -> int:
        """The bin a timestamp falls in."""
        return math.floor(ts / self.bin_seconds)

    def add(self, sample: Sample, held: HeldReadings | None = None) -> None:
        """Fold one validated sample into its bin; with ``held``, the window metrics the
        sample lacks for a device it reports take their held values first (and the
        ones it has are remembered): one pass over the wanted metrics, no copy of the
        sample (``detectors/held.py`` says what is held and for how long)."""
        ts = sample["ts"]
        node = sample["node"]
        node_bin = self.bins.setdefault(str(self.bin_of(ts)), {}).setdefault(
            node, {"g": {}, "n": {}})
        mine = held.node(node) if held is not None else None
        hold = held.hold_seconds if held is not None else 0.0
        for section, source, metrics in (("g", sample["gpus"], self.gpu_metrics),
                                         ("n", sample["nics"], self.nic_metrics)):
            target = node_bin[section]
            kept = mine[section] if mine is not None else None
            for dev, readings in source.items():
                acc = target.get(dev)
                if acc is None:
                    acc = target[dev] = {}
                last = kept.setdefault(dev, {}) if kept is not None else None
                get = readings.get
                for name in metrics:
                    value = get(name)
                    if value is None:
                        if last is None or (pair := last.get(name)) is None \
                                or not 0.0 <= ts - pair[1] <= hold:
                            continue
                        value = pair[0]
                    elif last is not None and ((pair := last.get(name)) is None
                                               or ts >= pair[1]):
                        last[name] = [value, ts]
                    total = acc.get(name)
                    if total is None:
                        acc[name] = [float(value), 1]
                    elif name in BIN_MAX_METRICS:
                        total[0] = max(total[0], value)
                    else:
                        total[0] += value
                        total[1] += 1

    def first_bin_from(self, b: int) -> int | None:
        """The first bin at or after ``b`` that holds data (None: none does)."""
        return min((int(k) for k in self.bins if int(k) >= b), default=None)

    def drop_before(self, first_bin: int) -> None:
        """Forget bins older than ``first_bin`` (bounded memory)."""
        for key in [k for k in self.bins if int(k) < first_bin]:
            del self.bins[key]
        for cached in [k for k in self._columns if k[1] < first_bin]:
            del self._columns[cached]

    def entities(self, section: str, bins: range) -> list[Entity]:
        """Every (node, device) seen in ``bins``, sorted for determinism."""
        found: set[Entity] = set()
        for b in bins:
            for node, data in self.bins.get(str(b), {}).items():
                found.update((node, dev) for dev in data[section])
        return sorted(found, key=lambda e: (e[0], _device_order(e[1])))

    def matrices(self, section: str, metrics: tuple[str, ...], entities: list[Entity],
                 bins: range) -> dict[str, Array]:
        """Metric → (entities × bins) means; NaN where nothing was read.

        Call only for bins that are sealed (evaluated): their columns are cached.
        """
        out = {m: np.full((len(entities), len(bins)), np.nan) for m in metrics}
        for j, b in enumerate(bins):
            cached = self._columns.get((section, b))
            if cached is None or cached[0] != entities:
                cached = (entities, self._column(section, b, entities))
                self._columns[(section, b)] = cached
            for m in metrics:
                column = cached[1].get(m)
                if column is not None:
                    out[m][:, j] = column
        return out

    def _column(self, section: str, b: int, entities: list[Entity]) -> dict[str, Array]:
        row = {e: i for i, e in enumerate(entities)}
        columns: dict[str, Array] = {}
        for node, data in self.bins.get(str(b), {}).items():
            for dev, readings in data[section].items():
                i = row.get((node, dev))
                if i is None:
                    continue
                for metric, pair in readings.items():
                    column = columns.get(metric)
                    if column is None:
                        column = columns[metric] = np.full(len(entities), np.nan)
                    column[i] = pair[0] / pair[1]
        return columns


def _device_order(dev: str) -> tuple[int, str]:
    return (int(dev), "") if dev.isdigit() else (1 << 30, dev)


class WindowView:
    """One evaluation's arrays: every windowed metric for every GPU and NIC, built once.

    ``gpu(m)`` is (GPUs × bins); ``per_node(m)`` is (nodes × GPU slots × bins), NaN
    padded, for comparing the GPUs of each node with each other.
    """

    def __init__(self, window: JobWindow, bins: range) -> None:
        self.bins = bins
        self.bin_seconds = window.bin_seconds
        self.gpus = window.entities("g", bins)
        self.nics = window.entities("n", bins)
        self.nodes = sorted({n for n, _ in self.gpus} | {n for n, _ in self.nics})
        self._gpu = window.matrices("g", window.gpu_metrics, self.gpus, bins)
        self._nic = window.matrices("n", window.nic_metrics, self.nics, bins)
        node_of = {n: i for i, n in enumerate(self.nodes)}
        slots: dict[str, int] = {}
        self._node_idx = np.empty(len(self.gpus), dtype=np.int64)
        self._slot_idx = np.empty(len(self.gpus), dtype=np.int64)
        for i, (node, _) in enumerate(self.gpus):
            self._node_idx[i] = node_of[node]
            self._slot_idx[i] = slots.get(node, 0)
            slots[node] = self._slot_idx[i] + 1
        self.max_slots = max(slots.values(), default=0)
        self._cubes: dict[str, Array] = {}

    def gpu(self, metric: str) -> Array:
        """(GPUs × bins) means of one GPU metric."""
        return self._gpu[metric]

    def nic(self, metric: str) -> Array:
        """(NICs × bins) means of one NIC metric."""
        return self._nic[metric]

    def per_node(self, metric: str) -> Array:
        """(nodes × GPU slots × bins) means of one GPU metric, NaN padded (shared: do
        not modify)."""
        cube = self._cubes.get(metric)
        if cube is None:
            cube = np.full((len(self.nodes), self.max_slots, len(self.bins)), np.nan)
            cube[self._node_idx, self._slot_idx] = self._gpu[metric]
            self._cubes[metric] = cube
        return cube

    def positions(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """Each GPU's (node index, slot) in ``per_node`` arrays, in ``gpus`` order."""
        return self._node_idx, self._slot_idx

    def gpu_at(self, node_index: int, slot: int) -> Entity:
        """The (node, gpu) entity at a position of ``per_node`` arrays."""
        mask = (self._node_idx == node_index) & (self._slot_idx == slot)
        return self.gpus[int(np.argmax(mask))]

    def bin_start(self, offset_from_end: int, of: int) -> float:
        """Event time at which bin ``offset_from_end`` of the last ``of`` bins begins."""
        return (self.bins[-1] - of + 1 + offset_from_end) * self.bin_seconds
