"""One fault of one node is one incident (DESIGN.md principle 17).

A node-wide event shows on every GPU of the node at once: a power brake or a
failing power supply raises the clock-event reasons of all eight GPUs, a bad board
retrains all their PCIe links, and the job's straggler test then also finds the
node (or its GPUs) slower than the others. Told one per GPU and kind, that is nine
pages for one fault. This step, run on one evaluation's findings, folds them:

- the same hardware finding (a clock event, a link fault) on at least half of a
  node's GPUs, and on two or more, becomes one finding on the node, naming its GPUs;
- a straggler (a GPU or a node slower than its peers) whose slowness a hardware
  finding of the same GPU or node already explains (a clock event, a link fault),
  or whose clock-event reasons name a fault in the latest sample, becomes part of
  that hardware finding: the hardware finding carries the straggler's numbers, and
  fires as soon as the straggler would have. Where the health check's timer has
  not yet run (a clock event seen for less than ``throttle_seconds``), the
  straggler is told as that clock event at once.

Stragglers whose host holds them back (``host_bound``) or whose GPU is shared with
another process stay what they are: no hardware finding explains them.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from vigil_gpu_monitor.detectors.findings import Finding

THROTTLE = ("throttle",)
REASONS = {0x8: "HW slowdown", 0x20: "SW thermal", 0x40: "HW thermal", 0x80: "HW power brake"}


def _hardware(f: Finding) -> bool:
    """A finding about the device itself: a clock event or a link fault."""
    return f.kind == "link_health" or (f.kind == "gpu_health" and f.metrics == THROTTLE)


def _explainable(f: Finding) -> bool:
    """A straggler whose slowness a hardware finding may explain."""
    return f.kind == "straggler" and not (f.evidence.get("host_bound")
                                         or f.evidence.get("shared_gpu"))


def reason_text(bits: int) -> str:
    """Clock-event reason bits in words (``0x80`` → ``HW power brake``)."""
    names = [name for bit, name in REASONS.items() if bits & bit]
    return ", ".join(names) or f"{bits:#x}"


def group_by_node(found: list[Finding], clock_faults: dict[str, int],
                  node_gpus: dict[str, int]) -> list[Finding]:
    """``found`` with each node's one fault told once.

    ``clock_faults``: ``"node/gpu"`` → the fault bits of its clock-event reasons in
    the latest sample; ``node_gpus``: how many GPUs each node has in the window.
    """
    if not found:
        return found
    hardware = [f for f in found if _hardware(f)]
    stragglers = [f for f in found if _explainable(f)]
    if not hardware and not (stragglers and clock_faults):
        return found
    out = [f for f in found if not _hardware(f) and not _explainable(f)]
    merged = _node_wide(hardware, clock_faults, node_gpus)
    for s in stragglers:
        target = _explaining(merged, s, clock_faults, node_gpus)
        if target is None:
            out.append(s)
            continue
        merged[target.key] = dataclasses.replace(
            target, fire_after=1, score=max(target.score, s.score),
            evidence={**target.evidence, "straggler": _straggler_numbers(s)})
    return out + sorted(merged.values(), key=lambda f: f.key)


def _node_wide(hardware: list[Finding], clock_faults: dict[str, int],
               node_gpus: dict[str, int]) -> dict[str, Finding]:
    """The hardware findings, those of one kind on half a node's GPUs or more made one."""
    by_node: dict[tuple[str, str, tuple[str, ...]], list[Finding]] = defaultdict(list)
    out: dict[str, Finding] = {}
    for f in hardware:
        if f.gpu is None or f.node is None:
            out[f.key] = f
        else:
            by_node[(f.node, f.kind, f.metrics if f.kind == "gpu_health" else ())].append(f)
    for (node, kind, _), group in by_node.items():
        if _most_of(len(group), node_gpus.get(node, 0)):
            f = _merge(node, kind, group)
            out[f.key] = _merge(node, kind, [out[f.key], f]) if f.key in out else f
        else:
            out.update((f.key, f) for f in group)
    return out


def _most_of(count: int, of: int) -> bool:
    return count >= 2 and count * 2 >= of


def _merge(node: str, kind: str, group: list[Finding]) -> Finding:
    """One node-level finding for ``group`` (same node and kind)."""
    gpus = sorted({g for f in group for g in (f.evidence.get("gpus") or [f.gpu]) if g},
                  key=lambda g: (len(g), g))
    first = min(group, key=lambda f: f.since)
    evidence: dict[str, Any] = {"gpus": gpus, "node_wide": True}
    if kind == "gpu_health":
        bits = 0
        for f in group:
            bits |= int(f.evidence.get("throttle_bits") or 0)
        seconds = max(float(f.evidence.get("seconds") or 0.0) for f in group)
        evidence.update(throttle_bits=bits, seconds=seconds)
        summary = (f"Node {node}: {len(gpus)} GPUs slowed together by clock-event reasons "
                   f"{bits:#x} ({reason_text(bits)}) for {seconds:.0f}s: one node-wide "
                   f"event (power delivery, cooling), not {len(gpus)} faults.")
    else:
        evidence["causes"] = [c for f in group for c in f.evidence.get("causes", [])]
        summary = f"Node {node}: {len(gpus)} GPUs' links degraded together: {first.summary}"
    order = ("info", "warning", "critical")
    severity = max((f.severity for f in group), key=order.index)
    metrics = tuple(dict.fromkeys(m for f in group for m in f.metrics))
    return Finding(kind, node, None, severity, metrics, max(f.score for f in group), summary,
                   first.since, evidence, fire_after=first.fire_after)


def _explaining(merged: dict[str, Finding], s: Finding, clock_faults: dict[str, int],
                node_gpus: dict[str, int]) -> Finding | None:
    """The hardware finding that explains straggler ``s``, found or to be made
    (a clock event the health check's timer has not reached yet)."""
    node, gpu = s.node, s.gpu
    for key in ([f"gpu_health|{node}|{gpu}", f"link_health|{node}|{gpu}"] if gpu else []) + [
            f"gpu_health|{node}|", f"link_health|{node}|"]:
        if key in merged:
            return merged[key]
    if _clock_fault_bits(node or "", gpu, clock_faults, node_gpus):
        return _clock_event(s, clock_faults, node_gpus)
    return None


def _clock_fault_bits(node: str, gpu: str | None, clock_faults: dict[str, int],
                      node_gpus: dict[str, int]) -> int:
    """The fault bits that explain a GPU (its own) or a node (half its GPUs')."""
    if gpu is not None:
        return clock_faults.get(f"{node}/{gpu}", 0)
    mine = [bits for key, bits in clock_faults.items() if key.rsplit("/", 1)[0] == node]
    if not _most_of(len(mine), node_gpus.get(node, 0)):
        return 0
    out = 0
    for bits in mine:
        out |= bits
    return out


def _clock_event(s: Finding, clock_faults: dict[str, int], node_gpus: dict[str, int]
                 ) -> Finding:
    """Straggler ``s`` told as the clock event its reasons name."""
    node = s.node or ""
    bits = _clock_fault_bits(node, s.gpu, clock_faults, node_gpus)
    if s.gpu is None:
        gpus = sorted((k.rsplit("/", 1)[1] for k in clock_faults
                       if k.rsplit("/", 1)[0] == node), key=lambda g: (len(g), g))
        who, evidence = f"Node {node}", {"gpus": gpus, "node_wide": True}
    else:
        who, evidence = f"GPU {s.gpu} on {node}", {}
    summary = (f"{who} is slowed by clock-event reasons {bits:#x} ({reason_text(bits)}): "
               f"{s.summary}")
    return Finding("gpu_health", s.node, s.gpu, "warning", THROTTLE, s.score, summary, s.since,
                   {**evidence, "throttle_bits": bits, "seconds": None}, fire_after=1)


def _straggler_numbers(s: Finding) -> dict[str, Any]:
    """What the straggler test read, kept on the hardware finding that explains it."""
    keep = ("busy", "peer_busy", "work_ratio", "sm_clock", "peer_sm_clock", "z")
    return {"summary": s.summary, **{k: s.evidence.get(k) for k in keep}}
