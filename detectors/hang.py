"""Job hangs: every GPU stopped making progress while a kernel stays resident.

A job stuck in a collective keeps NCCL's kernel spinning: NVML utilisation reads
100 % (a kernel is resident), yet no tensor work is done, no DRAM bytes move for the
step and NVLink and InfiniBand carry nothing. How many SMs the spin holds is not a
constant: a spinning NCCL kernel holds one SM per channel (NVIDIA/nccl#1656), and
jobs run from 2 channels (NVLS/SHARP) to 32 (H100 jobs log "24 coll channels",
NVIDIA/nccl#1781), so ``sm_active`` reads anything from 0.015 to 0.24 (NCCL's
ceiling, 64 channels, is 0.48 of an H100). The test therefore reads *progress*, not
the SM level:

- a GPU makes no progress in a bin when a kernel is resident (``gpu_util`` above
  one half), its memory is still allocated, and its tensor and DRAM activity are
  both below a tenth of the job's own working level (``NO_WORK_SHARE`` of the
  highest median GPU reading the job has shown, learned from its healthy bins: a
  training step keeps them at tens of percent, a spinning kernel polls a flag and
  moves about 1 % of DRAM cycles); its SM activity is at most what
  NCCL's most channels hold (``MAX_SPIN_SM``, with room for noise): a GPU that keeps more than that
  resident runs something else;
- a GPU that moves NVLink bytes makes progress, whatever its work counters read;
- the job is hung in a bin when ``SHARE`` of its reporting GPUs make no progress
  and its median NVLink and InfiniBand traffic are below what any collective moves.
  The share, not the median alone, keeps one node's traffic from being outvoted: a
  healthy 1F1B pipeline whose fast stages wait half of each 20 s step, read every
  5 s, had every node but one in its wait in the same bins, and that one node's
  gradients on NVLink were below the job's median (held-out envelope seed 227).

A checkpoint or an evaluation pause differs: utilisation drops (no kernel) or work
goes on. A job whose other GPUs wait in the collective for one that still computes
(a hot MoE expert, a straggler, in a step of up to 30 s) shows the signature on
nearly all of its GPUs, but it is waiting, not stuck: while a GPU of the job still
does work in the newest bin, the signature must last ``waiting_seconds`` before it
is a hang (a rank stuck computing forever is one too, found later).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from vigil_gpu_monitor.detectors.findings import Finding, fmt
from vigil_gpu_monitor.detectors.robust import nanmedian
from vigil_gpu_monitor.detectors.window import WindowView

SPIN_UTIL = 0.5  # a kernel is resident most of the time
MAX_SPIN_SM = 0.6  # NCCL's most channels (64) hold 0.48 of an H100's SMs, 0.59 of an A100's
NO_WORK_SHARE = 0.1  # of the job's working level: no progress
NO_WORK_LEAST = 0.005  # ... and this share of cycles at least (a job with little such work)
NO_WORK_UNLEARNED = 0.02  # before the job was seen working
QUIET_NVLINK = 1e9  # bytes/s
QUIET_IB = 1e8  # bytes/s
ALLOCATED = 1 << 30  # bytes of device memory still held
SHARE = 0.9  # of the job's GPUs
WORK = ("tensor_active", "dram_active")
GPU_READS = ("sm_active", "tensor_active", "dram_active", "gpu_util", "mem_used", "nvlink_tx")
NIC_READS = ("ib_tx",)


@dataclass(frozen=True)
class HangParams:
    """How long the signature must last: when no GPU works, and while one does."""

    seconds: float = 10.0
    waiting_seconds: float = 60.0


def learn_levels(view: WindowView, memory: dict[str, Any]) -> None:
    """Raise the job's working level of each work counter to the newest bin's median
    GPU where it is higher (``memory``: engine state)."""
    levels = memory.setdefault("levels", {})
    for metric in WORK:
        newest = view.gpu(metric)[:, -1]
        if not np.isnan(newest).all():
            levels[metric] = max(float(levels.get(metric, 0.0)),
                                 float(nanmedian(newest, axis=0)))


def _working(view: WindowView, last: int, memory: dict[str, Any]) -> NDArray[np.bool_]:
    """(GPUs × the ``last`` bins): True where a GPU does work (tensor or DRAM activity
    above the no-progress ceiling), False where it does none or has no such reading."""
    out = np.zeros((len(view.gpus), last), dtype=bool)
    levels = memory.get("levels", {})
    for metric in WORK:
        level = levels.get(metric)
        ceiling = NO_WORK_UNLEARNED if not level else max(NO_WORK_LEAST, NO_WORK_SHARE * level)
        with np.errstate(invalid="ignore"):
            out |= view.gpu(metric)[:, -last:] > ceiling
    return out


def hung_bins(view: WindowView, last: int,
              memory: dict[str, Any]) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Per bin of the ``last`` bins: whether the job shows the hang signature, and
    whether the bin holds readings to tell (two GPUs or more read utilisation)."""
    sm, util = view.gpu("sm_active")[:, -last:], view.gpu("gpu_util")[:, -last:]
    mem, nvl = view.gpu("mem_used")[:, -last:], view.gpu("nvlink_tx")[:, -last:]
    # a GPU counts where the utilisation reading exists: one whose reading is missing
    # in a bin (a lost sample, a hold that ran out) neither confirms nor vetoes
    reporting = ~np.isnan(util)
    with np.errstate(invalid="ignore"):
        stuck = ((util > SPIN_UTIL) & ~(mem < ALLOCATED) & ~(sm > MAX_SPIN_SM)
                 & ~(nvl > QUIET_NVLINK) & ~_working(view, last, memory))
    count = np.sum(reporting, axis=0)
    share = np.where(count > 0, np.sum(stuck & reporting, axis=0) / np.maximum(count, 1), 0)
    quiet_nvl = ~(nanmedian(nvl, axis=0) > QUIET_NVLINK)
    ib = view.nic("ib_tx")[:, -last:] if view.nics else np.full((1, last), np.nan)
    quiet_ib = ~(nanmedian(ib, axis=0) > QUIET_IB)
    read = count >= 2
    return np.asarray((share >= SHARE) & quiet_nvl & quiet_ib & read), read


def find_hang(view: WindowView, p: HangParams, memory: dict[str, Any]) -> list[Finding]:
    """A job-level finding when the bins read since the signature began all show it,
    over at least ``p.seconds`` (``memory``: the job's working levels, engine state).

    Only bins that hold readings tell: at a long tick most bins hold none (an agent
    every 30 s fills one 5 s bin in six, or two where the nodes' clocks differ), and
    such a bin neither ends the signature nor adds to it. Judged on the newest bins
    alone, a hang seen every 30 s resolved in the empty bins between and fired again
    at the next sample (a page every half minute)."""
    need = max(1, int(np.ceil(p.seconds / view.bin_seconds)))
    if len(view.bins) < need or not view.gpus:
        return []
    hung, read = hung_bins(view, len(view.bins), memory)
    rows = np.flatnonzero(read)
    if rows.size == 0 or not hung[rows[-1]]:
        return []
    newest = int(rows[-1])
    broken = rows[~hung[rows]]
    first = int(rows[rows > broken[-1]][0]) if broken.size else int(rows[0])
    span = newest - first + 1  # bins from the first hung reading to the newest one
    # the others wait for one that works: a long step, until it lasts
    if bool(_working(view, len(view.bins) - newest, memory)[:, 0].any()):
        need = max(need, int(np.ceil(p.waiting_seconds / view.bin_seconds)))
    if span < need:
        return []
    since = view.bin_start(first, len(view.bins))
    # the detectors' own median: NaN, not a warning, where no GPU read the counter
    sm, util = (float(nanmedian(view.gpu(m)[:, first:newest + 1].ravel(), axis=0))
                for m in ("sm_active", "gpu_util"))
    summary = (f"Job appears hung: all {len(view.gpus)} GPUs keep a kernel resident "
               f"(utilisation {fmt(util, 'ratio')}, SM activity {fmt(sm, 'ratio')}) with no "
               f"tensor or memory work and no NVLink or InfiniBand traffic for "
               f"{span * view.bin_seconds:.0f}s (a stuck collective).")
    return [Finding("hang", None, None, "critical", ("sm_active", "gpu_util", "nvlink_tx", "ib_tx"),
                    float(span * view.bin_seconds), summary, since,
                    {"sm_active_median": None if np.isnan(sm) else round(sm, 4),
                     "gpu_util_median": round(util, 4),
                     "gpus": len(view.gpus), "hung_seconds": span * view.bin_seconds},
                    fire_after=1)]
