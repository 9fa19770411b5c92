"""Whether a job's GPUs and nodes move together (DESIGN.md principle 17).

Every barrier-based rule (stragglers, load imbalance, host-bound nodes, hangs, the
job's slowdown) presumes that a GPU's peers wait for it. Independent inference or
serving replicas wait for nobody: each replica's load is its own, so comparing it
with its peers finds "stragglers" and "load" that are only traffic. Synchrony is
therefore measured, or declared; it is presumed only where nothing measures it.

**Measured**, per level (the GPUs of a node; the nodes of the job), from two
witnesses:

- *Collective traffic.* A synchronous job exchanges gradients, activations or
  tokens every step: bytes move over NVLink within a node or over InfiniBand between
  nodes. A level whose link counters are read but never carried a collective's
  bytes (``GPU_LINK``, ``NODE_LINK``) does not move together: on a system whose
  NVLink counters are read, a node's GPUs that exchange anything do it over NVLink.
  Once seen, traffic
  counts for good: a hung or paused synchronous job moves nothing, and is still
  synchronous.
- *Busy time that moves together.* Ranks that wait for each other complete the same
  steps, so their busy shares differ only by their share of the step's work: a
  pipeline stage (partitioners balance stages within about a quarter) or an MoE
  expert's load (capacity factors cap it, and a hot expert is one GPU of many). The
  median rank sits within ``SYNC_SPREAD`` (a quarter, in log units) of the level's
  median. Independent replicas follow their own requests: their busy shares spread
  by factors. A level whose median departure exceeds ``SYNC_SPREAD`` in most of
  its recent working bins does not move together, whatever bytes it moves (serving
  replicas ship requests, responses and KV caches). Bins where the job does no work
  (pauses, hangs) are not judged.

- *A kernel always resident.* A rank of a synchronous job is never without a kernel
  but while its own host prepares the next step: while it waits for its peers,
  NCCL's kernel spins. A job whose median GPU runs no kernel ``IDLE_SHARE`` of the
  time or more, in most of its recent working bins, waits on requests, not on its
  peers: its nodes are not compared (a job input-bound on every node has no node to
  blame either).

"Most": ``APART_SHARE`` of the last ``SPREAD_BINS`` working bins, once ``MIN_JUDGED``
are in (a minute: a warm-up that loads data does not decide it); from then on the
job stays apart.

Nodes move together only where their GPUs do. A job whose agents report neither
link (no NVLink counters, no InfiniBand ports) and whose busy time moves together is
presumed synchronous, as training jobs are.

**Declared.** A sample's ``meta.job_sync`` (``true`` or ``false``, from the
scheduler's attribution or the agent's configuration) decides for the whole job.

Left: a synchronous job that communicates only through a path Vigil does not read
(TCP sockets, PCIe peer-to-peer without NVLink) is told asynchronous until declared;
replicas whose loads happen to stay within a quarter of each other are compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vigil_gpu_monitor.detectors.robust import Array, nanmedian
from vigil_gpu_monitor.detectors.window import WindowView

GPU_LINK = 1e9  # bytes/s over NVLink: a collective, not housekeeping
NODE_LINK = 1e8  # bytes/s over InfiniBand from a node
SYNC_SPREAD = 0.22  # log(1.25): the median rank's departure from its level's median
IDLE_SHARE = 0.2  # the median GPU without a kernel this share of the time: no barrier
SPREAD_BINS = 24  # working bins judged (two minutes of 5 s bins)
MIN_JUDGED = 12
APART_SHARE = 0.75
WORKING = 0.05  # the job's median busy share: below, a pause or a hang, not judged
GPU_READS = ("nvlink_tx", "sm_active", "tensor_active", "gpu_util")
NIC_READS = ("ib_tx",)


@dataclass(frozen=True)
class Synchrony:
    """Which barrier-based comparisons a job supports now."""

    gpus: bool  # its GPUs wait for each other (GPU straggler test, hang)
    nodes: bool  # its nodes wait for each other (node straggler test, host-bound, slowdown)


def declared(meta: dict[str, Any] | None) -> bool | None:
    """``meta.job_sync`` of a sample, where it is a boolean."""
    value = (meta or {}).get("job_sync")
    return value if isinstance(value, bool) else None


class BinLevels:
    """The job's median GPU busy share of each sealed bin, kept from step to step.

    A sealed bin's means never change, so its median across the job's GPUs is
    taken once, not in every step whose window holds it: the window's twelve
    medians were 27 ms a step at 131,072 GPUs, one is 1.2 ms. Not engine state:
    after a restore each is taken again, to the same value (a column's median is
    the same arithmetic alone as in the window's matrix)."""

    def __init__(self) -> None:
        self._metric: str | None = None
        self._levels: dict[int, float] = {}

    def of(self, view: WindowView, metric: str, busy: Array) -> Array:
        """The median of each of the view's bins of ``busy`` (GPUs × bins)."""
        if metric != self._metric:
            self._metric, self._levels = metric, {}
        levels = np.empty(len(view.bins))
        for j, b in enumerate(view.bins):
            level = self._levels.get(b)
            if level is None:
                level = float(nanmedian(busy[:, j], axis=0))
                if b in view.sealed:
                    self._levels[b] = level
            levels[j] = level
        for b in [b for b in self._levels if b not in view.bins]:
            del self._levels[b]
        return levels


def judge(view: WindowView, memory: dict[str, Any],
          levels: BinLevels | None = None) -> Synchrony:
    """The job's synchrony after the view's latest bin; ``memory`` (engine state)
    keeps what was seen and any declaration; ``levels`` (not state) the job's
    median GPU of each sealed bin."""
    said = memory.get("declared")
    if isinstance(said, bool):
        return Synchrony(said, said)
    _traffic(memory, "nvlink", view.gpu("nvlink_tx")[:, -1], GPU_LINK)
    _traffic(memory, "ib", view.nic("ib_tx")[:, -1] if view.nics else np.full(0, np.nan),
             NODE_LINK)
    spreads = _spreads(view, levels or BinLevels())
    if spreads is not None:
        _spread(memory, "gpus", spreads[0])
        _spread(memory, "nodes", spreads[1])
        _spread(memory, "idle", spreads[2], IDLE_SHARE)
    nvlink, infiniband = memory.get("nvlink"), memory.get("ib")
    # on an NVLink system a node's GPUs that talk at all talk over it
    gpus = nvlink is not False and not (nvlink is None and infiniband is False) \
        and _together(memory, "gpus")
    nodes = gpus and infiniband is not False and _together(memory, "nodes") \
        and _together(memory, "idle")
    return Synchrony(gpus, nodes)


def _spreads(view: WindowView, levels: BinLevels) -> tuple[float, float, float] | None:
    """The median GPU's departure from its node's median busy share, the median
    node's from the job's (log units), and the share of time the job's median GPU
    runs no kernel (NaN: no utilisation reading), over the window's working bins; None where
    the newest bin is not a working one. Window means, not one bin: a node's one-bin
    reading swings with the part of a long step its agent's window caught."""
    metric = view.activity_metric()
    if metric is None:
        return None
    busy = view.gpu(metric)
    with np.errstate(invalid="ignore", divide="ignore"):
        level = levels.of(view, metric, busy)  # the job's median GPU per bin
        working = np.nan_to_num(level) >= WORKING
        if not working[-1]:
            return None
        kept = np.where(working[None, :], busy, np.nan)
        mean = np.nansum(kept, axis=1) / np.sum(~np.isnan(kept), axis=1)
        log_busy = np.full((len(view.nodes), view.max_slots), np.nan)
        nodes, slots = view.positions()
        log_busy[nodes, slots] = np.log(np.where(mean > 0, mean, np.nan))
        node_level = nanmedian(log_busy, axis=1)
        within = nanmedian(np.abs(log_busy - node_level[:, None]), axis=1)
        across = (nanmedian(np.abs(node_level - nanmedian(node_level, axis=0)), axis=0)
                  if int(np.sum(~np.isnan(node_level))) >= 2 else np.nan)
        util = view.gpu("gpu_util")
        idle = float(1.0 - nanmedian(np.where(working[None, :], util, np.nan).ravel(), axis=0))
    return float(nanmedian(within, axis=0)), float(across), idle


def _traffic(memory: dict[str, Any], key: str, values: Any, level: float) -> None:
    """Record whether a link was read (False) and ever carried a collective (True)."""
    if memory.get(key) is True or np.isnan(values).all():
        return
    memory[key] = bool(float(nanmedian(values, axis=0)) > level)


def _spread(memory: dict[str, Any], level: str, spread: float,
            limit: float = SYNC_SPREAD) -> None:
    """Append one working bin's judgement (``spread`` beyond ``limit``) of a witness."""
    if np.isnan(spread):
        return
    recent = memory.setdefault(f"{level}_spread", [])
    recent.append(spread > limit)
    del recent[:-SPREAD_BINS]


def _together(memory: dict[str, Any], level: str) -> bool:
    """Whether a witness lets the level be compared as one that waits for itself:
    neither found apart nor torn. Torn is a witness that has judged ``MIN_JUDGED``
    recent working bins and found more than ``1 - APART_SHARE`` of them apart: a
    synchronous job's level departs in a bin now and then (a long step that a tick
    cut, a checkpoint's stragglers), not in one bin of four; replicas whose load
    hovers near a limit do. A torn level is judged again with every bin, and is
    compared again once its departures are rare; a training job still warming up
    (fewer bins judged) is compared as before."""
    if _dispersed(memory, level):
        return False
    recent = memory.get(f"{level}_spread", [])
    return len(recent) < MIN_JUDGED or sum(recent) <= (1 - APART_SHARE) * len(recent)


def _dispersed(memory: dict[str, Any], level: str) -> bool:
    """Whether a witness says the level does not move together: in ``APART_SHARE`` of
    its recent working bins, once ``MIN_JUDGED`` are in. Then for good: a job does not
    turn from serving into training (a burst of requests that evens the load out
    for a minute does not make replicas wait for each other)."""
    if memory.get(f"{level}_apart"):
        return True
    recent = memory.get(f"{level}_spread", [])
    apart = len(recent) >= MIN_JUDGED and sum(recent) >= APART_SHARE * len(recent)
    if apart:
        memory[f"{level}_apart"] = True
    return apart
