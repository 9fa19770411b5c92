"""Link health: PCIe, NVLink and InfiniBand links that are worse than their peers'.

- PCIe generation or width below the job's typical value, judged only in bins
  where the GPU is under load (idle links legitimately drop to a lower generation),
  for a minute in which it never came back up (power management does).
- NVLink throughput well below the other GPUs of the node while they communicate.
- InfiniBand: a port rate below its peers', error counters that keep rising, and
  transmit back-pressure (``ib_xmit_wait``) unlike the other ports of the job.

All causes on one GPU (or one node, for NICs) merge into one finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vigil_gpu_monitor.detectors.findings import Finding, fmt
from vigil_gpu_monitor.detectors.robust import Array, nanmedian, persistent, robust_z, robust_z_axis
from vigil_gpu_monitor.detectors.window import WindowView

LOADED_SM_ACTIVE = 0.2
PCIE_LOOK_BINS = 12  # a PCIe link low under load for this long (a minute) ...
PCIE_LOW_BINS = 6  # ... in this many loaded bins, and never at its peers' level
COMMUNICATING_NVLINK = 1e9  # bytes/s: the node's median GPU is moving data
NVLINK_ABS_FLOOR = COMMUNICATING_NVLINK / 10  # the scale of NVLink's scores: at least
NVLINK_REL_FLOOR = 0.05  # this, and this share of the node's median
WAIT_FLOOR = 0.25  # the scale of back-pressure scores (log10 of ticks/s): at least this
GPU_READS = ("sm_active", "tensor_active", "pcie_gen", "pcie_width", "pcie_replay",
             "nvlink_tx", "nvlink_total")
NIC_READS = ("ib_rate", "ib_errors", "ib_xmit_wait")


@dataclass(frozen=True)
class LinkParams:
    """Thresholds shared by the link checks."""

    z: float = 4.0
    need_bins: int = 3
    of_bins: int = 4
    errors_per_window: float = 10.0  # rise of ib_errors over the last ``of_bins`` bins
    # PCIe replays over the last ``of_bins`` bins: a few are routine, a link that
    # replays this often is failing its transfers (a bad riser, a marginal slot)
    replays_per_window: float = 100.0


def find_link_faults(view: WindowView, p: LinkParams) -> list[Finding]:
    """link_health findings, one per GPU or node."""
    if len(view.bins) < p.of_bins:
        return []
    causes: dict[tuple[str, str | None], list[dict[str, Any]]] = {}
    _pcie(view, p, causes)
    _pcie_replays(view, p, causes)
    _nvlink(view, p, causes)
    _infiniband(view, p, causes)
    findings = []
    for (node, gpu), found in sorted(causes.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
        metrics = tuple(dict.fromkeys(c["metric"] for c in found))
        what = "; ".join(c["text"] for c in found)
        who = f"GPU {gpu} on {node}" if gpu is not None else f"Node {node}"
        since = view.bin_start(min(c["first"] for c in found), p.of_bins)
        findings.append(Finding("link_health", node, gpu, "warning", metrics,
                                max(c["score"] for c in found), f"{who}: {what}.", since,
                                {"causes": [{k: v for k, v in c.items() if k != "text"}
                                            for c in found]}))
    return findings


def _add(causes: dict[tuple[str, str | None], list[dict[str, Any]]], key: tuple[str, str | None],
         **cause: Any) -> None:
    causes.setdefault(key, []).append(cause)


# Every check below judges the last ``of_bins`` bins, and every statistic it uses is
# taken per bin (across peers): each works on those bins alone, so a step costs what
# four bins cost, not the whole window.


def _all_within(values: Array, width: float) -> bool:
    """Every reading (NaN aside) within ``width`` of every other: then none is more
    than ``width`` under its column's median, and the check below it has nothing to
    find. False when there is no reading at all."""
    return bool(values.size) and bool(
        np.fmax.reduce(values, axis=None) - np.fmin.reduce(values, axis=None) < width)


def _calm_nodes(cube: Array, z: float) -> bool:
    """Whether no GPU's NVLink rate can score beyond half of ``z`` against its node:
    within each node (every GPU and bin of the cube), the spread of the readings is
    under half of ``z`` times the smallest scale ``robust_z_axis`` can use there (its
    absolute floor, or its relative floor of the node's lowest reading, which no
    median is under). Then every score is under ``z / 2``, rounding included, and the
    check has nothing to find. False where a node has no reading."""
    if not cube.size:
        return False
    high = np.fmax.reduce(cube, axis=(1, 2))
    low = np.fmin.reduce(cube, axis=(1, 2))
    least_scale = np.fmax(NVLINK_ABS_FLOOR, NVLINK_REL_FLOOR * np.abs(low))
    return bool(((high - low) < 0.5 * z * least_scale).all())


def _calm_ports(log_wait: Array, z: float) -> bool:
    """Whether no port's back-pressure can score beyond half of ``z``: every reading
    within half of ``z`` floor units (``WAIT_FLOOR``, the least scale of its scores)
    of every other (the usual step: nothing to time)."""
    return _all_within(log_wait, 0.5 * z * WAIT_FLOOR)


def _pcie(view: WindowView, p: LinkParams, causes: dict[Any, list[dict[str, Any]]]) -> None:
    """A GPU whose PCIe generation or width under load has been below its peers' for
    the last minute: low in ``need_bins`` of the last ``of_bins`` bins, in at least
    ``PCIE_LOW_BINS`` loaded bins of the last ``PCIE_LOOK_BINS``, and at its peers'
    level in none of them.

    An idle or lightly used link drops to a lower generation to save power and
    trains back up within milliseconds; a reading is one instant of that, and a bin
    keeps its best reading. A bin with one reading (a lossy node, a node whose
    samples arrive late) reads low by chance as often as the link idles (a third of
    the time in an evaluation pass): three bins in a row happen across a fleet, a
    minute of them does not. A trained-down link (a bad riser, a marginal slot)
    stays down until a reset: it is found a minute after it went down."""
    look = max(p.of_bins, PCIE_LOOK_BINS)
    with np.errstate(invalid="ignore"):
        loaded = view.activity()[:, -look:] > LOADED_SM_ACTIVE
    for metric in ("pcie_gen", "pcie_width"):
        readings = view.gpu(metric)
        # the usual step: none is low in the last bins (only those laid out first)
        if _all_within(np.where(loaded[:, -p.of_bins:], readings[:, -p.of_bins:], np.nan),
                       0.5):
            continue
        values = np.where(loaded, readings[:, -look:], np.nan)
        typical = nanmedian(values, axis=0)
        with np.errstate(invalid="ignore"):
            low = values < typical - 0.5
            full = values >= typical - 0.5
        recent = low[:, -p.of_bins:]
        for i in np.nonzero(recent.sum(axis=1) >= p.need_bins)[0]:
            if full[i].any() or low[i].sum() < PCIE_LOW_BINS:  # power management
                continue
            node, gpu = view.gpus[i]
            value = float(np.nanmedian(values[i, -p.of_bins:]))
            peer = float(np.nanmedian(typical[-p.of_bins:]))
            _add(causes, (node, gpu), metric=metric, value=value, peer_median=peer,
                 score=peer - value, first=int(np.argmax(recent[i])),
                 text=f"PCIe {'generation' if metric == 'pcie_gen' else 'width'} "
                      f"{value:.0f} under load vs peers' {peer:.0f}")


def _pcie_replays(view: WindowView, p: LinkParams,
                  causes: dict[Any, list[dict[str, Any]]]) -> None:
    """A GPU whose PCIe replay counter rose by ``replays_per_window`` or more over the
    last ``of_bins`` bins. The counter is cumulative: only a rise seen while watching
    counts, never the count it had when Vigil first saw it."""
    replays = view.gpu("pcie_replay")[:, -p.of_bins:]
    if np.isnan(replays).all():
        return
    rise = (np.fmax.reduce(replays, axis=1, initial=-np.inf)
            - np.fmin.reduce(replays, axis=1, initial=np.inf))
    for i in np.nonzero(np.isfinite(rise) & (rise >= p.replays_per_window))[0]:
        node, gpu = view.gpus[i]
        _add(causes, (node, gpu), metric="pcie_replay", value=float(rise[i]),
             score=float(rise[i]) / p.replays_per_window, first=_rise_began(replays[i]),
             text=f"PCIe replays rose by {rise[i]:.0f} in "
                  f"{p.of_bins * view.bin_seconds:.0f}s")


def _nvlink(view: WindowView, p: LinkParams, causes: dict[Any, list[dict[str, Any]]]) -> None:
    # exporters that do not split NVLink traffic by direction give its total
    metric = "nvlink_tx" if not np.isnan(view.gpu("nvlink_tx")).all() else "nvlink_total"
    cube = view.per_node(metric, last=p.of_bins)
    if _calm_nodes(cube, p.z):  # the usual step: no GPU can be far from its node's median
        return
    busy = nanmedian(cube, axis=1) > COMMUNICATING_NVLINK  # nodes × bins
    z = robust_z_axis(cube, axis=1, abs_floor=NVLINK_ABS_FLOOR, rel_floor=NVLINK_REL_FLOOR)
    z = np.where(busy[:, None, :], z, np.nan)
    test = persistent(z, p.z, p.need_bins, p.of_bins)
    for n, slot in zip(*np.nonzero(test.flagged & (test.sign < 0)), strict=True):
        node, gpu = view.gpu_at(int(n), int(slot))
        value = float(np.nanmedian(cube[n, slot]))
        peer = float(np.nanmedian(cube[n]))
        _add(causes, (node, gpu), metric=metric, value=value, peer_median=peer,
             score=float(-test.score[n, slot]), first=int(test.first[n, slot]),
             text=f"NVLink moves {fmt(value, 'bytes/s')} vs node peers' {fmt(peer, 'bytes/s')}")


def _infiniband(view: WindowView, p: LinkParams, causes: dict[Any, list[dict[str, Any]]]) -> None:
    if len(view.nics) < 2:
        return
    rate = view.nic("ib_rate")
    recent = rate[:, -p.of_bins:]
    if _all_within(recent, 0.5):
        low = np.zeros(recent.shape, dtype=bool)  # the usual step: every port at one rate
    else:
        with np.errstate(invalid="ignore"):
            low = recent < nanmedian(recent, axis=0) - 0.5
    slow = low.sum(axis=1) >= p.need_bins
    errors = view.nic("ib_errors")[:, -p.of_bins:]
    # ``nanmax``/``nanmin`` are these reductions for arrays, without their Python layers
    rise = (np.fmax.reduce(errors, axis=1, initial=-np.inf)
            - np.fmin.reduce(errors, axis=1, initial=np.inf))
    erring = np.isfinite(rise) & (rise >= p.errors_per_window)
    wait = view.nic("ib_xmit_wait")[:, -p.of_bins:]
    log_wait = np.log10(1.0 + wait)
    # calm ports: no score could pass half of ``z``, so zeros stand in for them
    wait_z = (np.zeros(log_wait.shape) if _calm_ports(log_wait, p.z)
              else robust_z(log_wait, abs_floor=WAIT_FLOOR)[0])
    waits = persistent(wait_z, p.z, p.need_bins, p.of_bins)
    waiting = waits.flagged & (waits.sign > 0)
    # the peers' rate over the whole window, as the text has always given it
    window_rate = float(np.nanmedian(nanmedian(rate, axis=0))) if slow.any() else np.nan
    for i in np.nonzero(slow | erring | waiting)[0]:  # the rest are fine: no Python step
        node, nic = view.nics[i]
        if slow[i]:
            value, peer = float(np.nanmedian(rate[i, -p.of_bins:])), window_rate
            _add(causes, (node, None), metric="ib_rate", nic=nic, value=value, peer_median=peer,
                 score=peer / max(value, 1.0), first=int(np.argmax(low[i])),
                 text=f"{nic} runs at {value:.0f} Gb/s vs peers' {peer:.0f} Gb/s")
        if erring[i]:
            _add(causes, (node, None), metric="ib_errors", nic=nic, value=float(rise[i]),
                 score=float(rise[i]), first=_rise_began(errors[i]),
                 text=f"{nic} error counters rose by {rise[i]:.0f} in "
                      f"{p.of_bins * view.bin_seconds:.0f}s")
        if waiting[i]:
            value = float(np.nanmedian(wait[i]))
            peer = float(np.nanmedian(wait))
            _add(causes, (node, None), metric="ib_xmit_wait", nic=nic, value=value,
                 peer_median=peer, score=float(waits.score[i]), first=int(waits.first[i]),
                 text=f"{nic} transmit back-pressure {fmt(value)} ticks/s vs peers' {fmt(peer)}")


def _rise_began(counts: Array) -> int:
    """The first bin of the window whose count is above the window's lowest: when
    the errors began (dating it from the window's start put a cost estimate's bins
    before the fault)."""
    with np.errstate(invalid="ignore"):
        return int(np.argmax(counts > np.nanmin(counts)))
