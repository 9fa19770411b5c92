"""Job hangs: every GPU stopped making progress while still "busy".

A job stuck in a collective keeps one NCCL kernel spinning on a handful of SMs:
NVML utilisation reads 100 %, SM activity about 1/SM-count, memory stays
allocated and NVLink/InfiniBand carry nothing. A checkpoint or evaluation pause
differs: utilisation drops (no kernel running) or SM activity stays well above
the spin level. A hang is declared when that signature covers nearly all GPUs
for ``seconds`` of consecutive bins.

A job whose other GPUs wait in the collective for one that still computes (a hot
MoE expert, a straggler, in a step of up to 30 s) shows the same signature on
nearly all of its GPUs, but it is waiting, not stuck: while a GPU of the job still
computes in the newest bin, the signature must last ``waiting_seconds`` before it is
a hang (a rank stuck computing forever is one too, found later).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.findings import Finding, fmt
from detectors.robust import nanmedian
from detectors.window import WindowView

SPIN_SM_ACTIVE = 0.03  # at most a few SMs busy
SPIN_UTIL = 0.5  # yet a kernel is resident most of the time
QUIET_NVLINK = 1e9  # bytes/s
QUIET_IB = 1e8  # bytes/s
ALLOCATED = 1 << 30  # bytes of device memory still held
SHARE = 0.9  # of the job's GPUs
COMPUTING_SM_ACTIVE = 0.2  # a GPU this active over a bin still runs the step's kernels
GPU_READS = ("sm_active", "tensor_active", "gpu_util", "mem_used", "nvlink_tx")
NIC_READS = ("ib_tx",)


@dataclass(frozen=True)
class HangParams:
    """How long the signature must last: when no GPU computes, and while one does."""

    seconds: float = 10.0
    waiting_seconds: float = 60.0


def hung_bins(view: WindowView, last: int) -> np.ndarray:
    """Boolean per bin of the ``last`` bins: the job shows the hang signature (each
    bin is judged on its own, so the older bins are looked at only when the newest
    all show it)."""
    sm, util = view.activity()[:, -last:], view.gpu("gpu_util")[:, -last:]
    mem, nvl = view.gpu("mem_used")[:, -last:], view.gpu("nvlink_tx")[:, -last:]
    # a GPU counts where both signature readings exist: one whose utilisation reading is
    # missing in a bin (a lost sample, a hold that ran out) neither confirms nor vetoes
    reporting = ~np.isnan(sm) & ~np.isnan(util)
    with np.errstate(invalid="ignore"):
        spinning = (sm < SPIN_SM_ACTIVE) & (util > SPIN_UTIL) & ~(mem < ALLOCATED)
    count = np.sum(reporting, axis=0)
    share = np.where(count > 0, np.sum(spinning & reporting, axis=0) / np.maximum(count, 1), 0)
    quiet_nvl = ~(nanmedian(nvl, axis=0) > QUIET_NVLINK)
    ib = view.nic("ib_tx")[:, -last:] if view.nics else np.full((1, sm.shape[1]), np.nan)
    quiet_ib = ~(nanmedian(ib, axis=0) > QUIET_IB)
    return np.asarray((share >= SHARE) & quiet_nvl & quiet_ib & (count >= 2))


def find_hang(view: WindowView, p: HangParams) -> list[Finding]:
    """A job-level finding when the latest bins all show the hang signature."""
    need = max(1, int(np.ceil(p.seconds / view.bin_seconds)))
    if len(view.bins) < need or not view.gpus:
        return []
    with np.errstate(invalid="ignore"):
        idle = view.activity()[:, -need:] < SPIN_SM_ACTIVE
    if not idle.any(axis=0).all():  # the usual step: a bin where no GPU spins
        return []
    if not hung_bins(view, need).all():
        return []
    hung = hung_bins(view, len(view.bins))
    with np.errstate(invalid="ignore"):
        computing = bool((view.activity()[:, -1] >= COMPUTING_SM_ACTIVE).any())
    if computing:  # the others wait for it: a long step, until it lasts
        need = max(need, int(np.ceil(p.waiting_seconds / view.bin_seconds)))
        if len(hung) < need or not hung[-need:].all():
            return []
    run = need
    while run < len(hung) and hung[-run - 1]:
        run += 1
    since = view.bin_start(0, run)
    sm = float(np.nanmedian(view.activity()[:, -need:]))
    util = float(np.nanmedian(view.gpu("gpu_util")[:, -need:]))
    summary = (f"Job appears hung: all {len(view.gpus)} GPUs spin at SM activity "
               f"{fmt(sm, 'ratio')} with utilisation {fmt(util, 'ratio')} and no NVLink or "
               f"InfiniBand traffic for {run * view.bin_seconds:.0f}s (a stuck collective).")
    return [Finding("hang", None, None, "critical", ("sm_active", "gpu_util", "nvlink_tx", "ib_tx"),
                    float(run * view.bin_seconds), summary, since,
                    {"sm_active_median": round(sm, 4), "gpu_util_median": round(util, 4),
                     "gpus": len(view.gpus), "hung_seconds": run * view.bin_seconds},
                    fire_after=1)]
