"""Event-time bins of one job's per-rank step timings (``vigil.step/1``).

A step belongs to the bin its ``end`` falls in, the same bins as the counters'
window, so the engine evaluates both for one bin at once. A bin keeps each rank's
steps as ``[step, compute, wall]`` (compute null where the source did not give it),
at most ``MAX_STEPS_PER_BIN`` a rank (a source that sends more is counted in
``overflow``, never buffered without bound). The whole state is JSON-able for the
worker's table.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from vigil_gpu_monitor.contracts.messages import StepBatch

MAX_STEPS_PER_BIN = 256  # a rank's steps kept per bin (20 ms steps in a 5 s bin)
MAX_RANKS = 1 << 17  # ranks one job's window keeps (a 131,072-GPU job)


def rank_key(node: str, gpu: str | None, rank: int | None) -> str:
    """A rank's identity in the window: its node and GPU where known, else its global
    rank, else the node's one anonymous logger."""
    if gpu is not None:
        return f"{node}/{gpu}"
    return f"{node}/r{rank}" if rank is not None else f"{node}/-"


class StepWindow:
    """One job's step timings by bin and rank, and what is known of each rank."""

    def __init__(self, bin_seconds: float, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.bin_seconds = bin_seconds
        # rank key → {"node", "gpu", "stage", "rank"}
        self.ranks: dict[str, dict[str, Any]] = state.get("ranks", {})
        self.bins: dict[str, dict[str, list[list[Any]]]] = state.get("bins", {})
        self.overflow: int = state.get("overflow", 0)

    def to_state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {"ranks": self.ranks, "bins": self.bins, "overflow": self.overflow}

    def bin_of(self, ts: float) -> int:
        """The bin a time falls in (the counters' window's bins)."""
        return math.floor(ts / self.bin_seconds)

    def add(self, batch: StepBatch, first_open: int | None) -> tuple[int, int, float | None]:
        """Fold a validated batch in; steps ending before bin ``first_open`` are late.
        Returns (steps added, steps late, the latest end added)."""
        node, added, late, latest = batch["node"], 0, 0, None
        for entry in batch["ranks"]:
            key = rank_key(node, entry.get("gpu"), entry["rank"])
            if key not in self.ranks:
                if len(self.ranks) >= MAX_RANKS:
                    self.overflow += len(entry["steps"])
                    continue
                self.ranks[key] = {"node": node, "gpu": entry.get("gpu"),
                                   "stage": entry.get("stage", 0), "rank": entry["rank"]}
            for step in entry["steps"]:
                b = self.bin_of(step["end"])
                if first_open is not None and b < first_open:
                    late += 1
                    continue
                kept = self.bins.setdefault(str(b), {}).setdefault(key, [])
                if len(kept) >= MAX_STEPS_PER_BIN:
                    self.overflow += 1
                    continue
                kept.append([step["step"], step.get("compute"), step["wall"]])
                added += 1
                latest = step["end"] if latest is None else max(latest, step["end"])
        return added, late, latest

    def first_bin(self) -> int | None:
        """The earliest bin holding steps."""
        return min(map(int, self.bins)) if self.bins else None

    def medians(self, b: int) -> dict[str, tuple[float, float]]:
        """Rank key → (median compute, mean wall) of its steps in bin ``b`` (compute
        NaN where none was given). The compute is compared with peers: a median, as a
        stray step must not make a straggler; the wall is what the job spent: a mean,
        which a cost adds up."""
        out: dict[str, tuple[float, float]] = {}
        for key, steps in self.bins.get(str(b), {}).items():
            computes = [c for _, c, _ in steps if c is not None]
            walls = [w for _, _, w in steps]
            if not walls:
                continue
            out[key] = (statistics.median(computes) if computes else math.nan,
                        statistics.fmean(walls))
        return out

    def by_step(self, b: int) -> dict[int, tuple[float, dict[str, float]]]:
        """Step index → (its wall, rank key → compute) for the steps in bin ``b`` that
        carry compute times: what a what-if of one step without a rank reads."""
        out: dict[int, tuple[float, dict[str, float]]] = {}
        for key, steps in self.bins.get(str(b), {}).items():
            for index, compute, wall in steps:
                if compute is not None:
                    out.setdefault(int(index), (float(wall), {}))[1][key] = float(compute)
        return out

    def drop_before(self, b: int) -> None:
        """Forget bins before ``b`` (evaluated and out of the window)."""
        for name in [n for n in self.bins if int(n) < b]:
            del self.bins[name]
