"""Event-time windows of one job: per-bin means of every GPU and NIC metric.

Samples are folded into bins of ``bin_seconds`` as running sums, so a window costs
the same whatever the agents' sampling rate, and the whole state is a JSON-able
dict that a Faust table can changelog. Absent readings stay absent (NaN), never 0.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from contracts.catalog import GPU_METRICS, NIC_METRICS, Kind
from detectors.robust import Array

WINDOW_GPU_METRICS = tuple(m for m, spec in GPU_METRICS.items() if spec.kind is not Kind.STATE)
WINDOW_NIC_METRICS = tuple(m for m, spec in NIC_METRICS.items() if spec.kind is not Kind.STATE)

Entity = tuple[str, str]  # (node, gpu index or NIC name)


class JobWindow:
    """Binned readings of one job; ``bins[b][node]['g'|'n'][dev][metric] = [sum, count]``."""

    def __init__(self, bin_seconds: float, state: dict[str, Any] | None = None) -> None:
        self.bin_seconds = bin_seconds
        self.bins: dict[str, dict[str, Any]] = (state or {}).get("bins", {})

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for a table or a checkpoint."""
        return {"bins": self.bins}

    def bin_of(self, ts: float) -> int:
        """The bin a timestamp falls in."""
        return math.floor(ts / self.bin_seconds)

    def add(self, sample: dict[str, Any]) -> None:
        """Fold one validated sample into its bin."""
        node_bin = self.bins.setdefault(str(self.bin_of(sample["ts"])), {}).setdefault(
            sample["node"], {"g": {}, "n": {}})
        for section, source, names in (("g", sample["gpus"], WINDOW_GPU_METRICS),
                                       ("n", sample["nics"], WINDOW_NIC_METRICS)):
            target = node_bin[section]
            for dev, readings in source.items():
                acc = target.setdefault(dev, {})
                for name in names:
                    value = readings.get(name)
                    if value is not None:
                        pair = acc.get(name)
                        if pair is None:
                            acc[name] = [float(value), 1]
                        else:
                            pair[0] += value
                            pair[1] += 1

    def drop_before(self, first_bin: int) -> None:
        """Forget bins older than ``first_bin`` (bounded memory)."""
        for key in [k for k in self.bins if int(k) < first_bin]:
            del self.bins[key]

    def entities(self, section: str, bins: range) -> list[Entity]:
        """Every (node, device) seen in ``bins``, sorted for determinism."""
        found: set[Entity] = set()
        for b in bins:
            for node, data in self.bins.get(str(b), {}).items():
                found.update((node, dev) for dev in data[section])
        return sorted(found, key=lambda e: (e[0], _device_order(e[1])))

    def nodes(self, bins: range) -> set[str]:
        """Nodes that reported at least once in ``bins``."""
        return {node for b in bins for node in self.bins.get(str(b), {})}

    def matrices(self, section: str, metrics: tuple[str, ...], entities: list[Entity],
                 bins: range) -> dict[str, Array]:
        """Metric → (entities × bins) means, built in one pass; NaN where nothing was read."""
        out = {m: np.full((len(entities), len(bins)), np.nan) for m in metrics}
        row = {e: i for i, e in enumerate(entities)}
        for j, b in enumerate(bins):
            for node, data in self.bins.get(str(b), {}).items():
                for dev, readings in data[section].items():
                    i = row.get((node, dev))
                    if i is None:
                        continue
                    for metric, pair in readings.items():
                        target = out.get(metric)
                        if target is not None:
                            target[i, j] = pair[0] / pair[1]
        return out


def _device_order(dev: str) -> tuple[int, str]:
    return (int(dev), "") if dev.isdigit() else (1 << 30, dev)
