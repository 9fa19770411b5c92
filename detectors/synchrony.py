"""Whether a job's GPUs and nodes move together (DESIGN.md principle 17).

Every barrier-based rule (stragglers, load imbalance, host-bound nodes, hangs, the
job's slowdown) presumes that a GPU's peers wait for it. Independent inference or
serving replicas wait for nobody: each GPU's load is its own, so comparing it with
its peers finds "stragglers" and "load" that are only traffic. Synchrony is
therefore measured, or declared, never presumed where it can be measured.

**Measured.** A synchronous job exchanges gradients, activations or experts'
tokens in collectives every step, so bytes move between its GPUs: over NVLink
within a node, over InfiniBand between nodes. A job shows that it moves together
once a bin's median GPU sends more over NVLink than ``GPU_LINK`` (GPUs together),
or its median node sends more over InfiniBand than ``NODE_LINK`` (nodes together,
and so their GPUs). Once seen, it stays: a hung or paused synchronous job moves
nothing, and is still synchronous. Until then, the barrier rules of that level wait.
A job whose agents report neither link (no NVLink counters, no InfiniBand ports)
cannot be measured and is presumed synchronous, as training jobs are.

**Declared.** A sample's ``meta.job_sync`` (``true`` or ``false``, from the
scheduler's attribution or the agent's configuration) decides for the whole job.

Left: a synchronous job that communicates only through a path Vigil does not read
(TCP sockets, PCIe peer-to-peer without NVLink) is told asynchronous until declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.robust import nanmedian
from detectors.window import WindowView

GPU_LINK = 1e9  # bytes/s over NVLink: a collective, not housekeeping
NODE_LINK = 1e8  # bytes/s over InfiniBand from a node
GPU_READS = ("nvlink_tx",)
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


def judge(view: WindowView, memory: dict[str, Any]) -> Synchrony:
    """The job's synchrony after the view's latest bin; ``memory`` (engine state)
    keeps what was seen and any declaration."""
    said = memory.get("declared")
    if isinstance(said, bool):
        return Synchrony(said, said)
    if not memory.get("nodes"):
        ib = view.nic("ib_tx")[:, -1:] if view.nics else np.full((0, 1), np.nan)
        if ib.size and not np.isnan(ib).all():
            memory["ib_seen"] = True
            if float(nanmedian(ib[:, 0], axis=0)) > NODE_LINK:
                memory["nodes"] = True
    if not memory.get("gpus"):
        nvl = view.gpu("nvlink_tx")[:, -1:]
        if not np.isnan(nvl).all():
            memory["nvlink_seen"] = True
            if float(nanmedian(nvl[:, 0], axis=0)) > GPU_LINK:
                memory["gpus"] = True
    if not memory.get("ib_seen") and not memory.get("nvlink_seen"):
        return Synchrony(True, True)  # nothing to measure it by: presumed, as before
    nodes = bool(memory.get("nodes"))
    return Synchrony(nodes or bool(memory.get("gpus")), nodes)
