"""Network-bound phases: compute idles while the fabric runs near its peak.

Moneo found mixture-of-experts all-to-all phases where tensor cores sit mostly idle
and InfiniBand carries most of what it can. A bin is network-bound when the job's
median SM activity and tensor activity are low while the median NIC moves at least
``link_share`` of its current link rate; the job is flagged when most recent bins
are. The evidence gives the compute and communication shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil_gpu_monitor.detectors.findings import Finding, fmt
from vigil_gpu_monitor.detectors.robust import nanmedian
from vigil_gpu_monitor.detectors.window import WindowView

BITS_PER_BYTE = 8.0
GPU_READS = ("sm_active", "tensor_active")
NIC_READS = ("ib_tx", "ib_rx", "ib_rate")
HYSTERESIS = 0.1  # an open condition holds on thresholds this share looser
SILENT = 0.05  # link use below this: no collective traffic at all (a pause)


@dataclass(frozen=True)
class NetworkParams:
    """Thresholds of a network-bound bin and how many recent bins must be."""

    link_share: float = 0.4
    max_sm_active: float = 0.45
    max_tensor_active: float = 0.2
    need_bins: int = 4
    of_bins: int = 6


def find_network_bound(view: WindowView, p: NetworkParams, open_now: bool = False
                       ) -> list[Finding]:
    """One job-level finding while the job is network-bound. ``open_now``: the
    condition is already open, and holds on thresholds ``HYSTERESIS`` looser, so a
    job that sits at a threshold does not fire and resolve over and over."""
    if len(view.bins) < p.of_bins or not view.nics or not view.gpus:
        return []
    if open_now:
        p = NetworkParams(p.link_share * (1 - HYSTERESIS), p.max_sm_active * (1 + HYSTERESIS),
                          p.max_tensor_active * (1 + HYSTERESIS), p.need_bins, p.of_bins)
    recent = slice(-p.of_bins, None)  # each bin is judged on its own: only these count
    rate = view.nic("ib_rate")[:, recent] * 1e9 / BITS_PER_BYTE
    with np.errstate(invalid="ignore", divide="ignore"):
        link_use = (view.nic("ib_tx")[:, recent] + view.nic("ib_rx")[:, recent]) / 2 / rate
    comm = nanmedian(link_use, axis=0)
    with np.errstate(invalid="ignore"):
        if open_now and int(np.sum(comm < SILENT)) >= p.need_bins:
            # a checkpoint or evaluation pause: the fabric is silent, which says
            # nothing about the phase the job returns to; the condition holds
            return [Finding("network_bound", None, None, "info", ("ib_tx", "ib_rx"), 0.0,
                            "Job is network-bound (held through a pause: the fabric is "
                            "silent).", view.bin_start(0, p.of_bins), {"held": True})]
        if int(np.sum(comm >= p.link_share)) < p.need_bins:  # the usual step: not busy
            return []
    sm = nanmedian(view.activity()[:, recent], axis=0)
    tensor = nanmedian(view.gpu("tensor_active")[:, recent], axis=0)
    with np.errstate(invalid="ignore"):
        bound = (comm >= p.link_share) & (sm <= p.max_sm_active) & (tensor <= p.max_tensor_active)
    if int(np.sum(bound)) < p.need_bins:
        return []
    first = int(np.argmax(bound))
    c, s, t = (float(np.nanmedian(x[bound])) for x in (comm, sm, tensor))
    summary = (f"Job is network-bound: InfiniBand at {fmt(c, 'ratio')} of link rate while "
               f"SM activity is {fmt(s, 'ratio')} and tensor cores {fmt(t, 'ratio')}.")
    return [Finding("network_bound", None, None, "info",
                    ("ib_tx", "ib_rx", "sm_active", "tensor_active"), c / max(s, 0.01),
                    summary, view.bin_start(first, p.of_bins),
                    {"communication_share": round(c, 3), "compute_share": round(s, 3),
                     "tensor_active": round(t, 3), "bins": int(np.sum(bound))})]
