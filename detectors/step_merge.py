"""Put the counters' findings and the timings' findings of one bin together.

One fault is one incident: where both views name the same condition, the counters'
finding is kept (its id, its remediation facts) and carries the timings' numbers,
``sources: ["counters", "timings"]`` and ``agree: true``, and its cost becomes the
measured one (``cost_basis: steps``). The same fault seen at another level (a node
the counters blame, one of its GPUs the timings do; or the reverse) and a rank the
timings find slower where the counters see more work (``load_imbalance``: a hot
expert) is one condition too: the counters' finding names it, as they can tell work
from slowness and timings cannot. A timing ``slowdown`` that another finding of the
job explains (now, or at any time since it began: ``evidence.explained``) is that
finding's measured cost, not a finding of its own.

What only one view shows says so: ``agree: false`` where the other view covers the
same place and saw nothing (for a counters' straggler: its ranks' compute is not
``MIN_EXCESS`` above their peers'; ``agree: true`` where it is, even before the
timings' own evidence has reached its threshold). A straggler seen only in timings, on GPUs whose
counters look normal (or where no counters speak), is ``remediable: false``: its
cause is the host, the data or the software, not the GPU (``agree: null``: no
counters to ask).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from vigil_gpu_monitor.detectors.cost import cost_fields, is_costed
from vigil_gpu_monitor.detectors.findings import Finding

EXPLAINING = frozenset({"straggler", "link_health", "network_bound", "hang", "load_imbalance",
                        "node_silent", "gpu_health"})
_TIMING_KEYS = ("compute", "peer_compute", "share_above_peers", "stage", "ranks", "step",
                "healthy_step", "stages", "evidence_ratio")


def _measured(counter: Finding, timing: Finding) -> Finding:
    """The counters' finding with the timings' numbers and measured cost."""
    ev: dict[str, Any] = {**counter.evidence, "sources": ["counters", "timings"], "agree": True,
                          "timings": {k: timing.evidence[k] for k in _TIMING_KEYS
                                      if k in timing.evidence}}
    if timing.evidence.get("cost_basis") == "steps":
        gpus = int(counter.evidence.get("job_gpus") or timing.evidence.get("job_gpus") or 0)
        ev.update(cost_fields(gpus, timing.evidence["job_slowdown"], "steps"))
    return dataclasses.replace(counter, evidence=ev)


def _same_fault(counters: list[Finding], t: Finding) -> list[int]:
    """Indexes of the counters' findings that name the fault ``t`` names."""
    exact = [i for i, f in enumerate(counters) if f.key == t.key]
    if exact or t.kind != "straggler":
        return exact
    near = [i for i, f in enumerate(counters) if f.node == t.node
            and f.kind == "straggler" and (f.gpu is None or t.gpu is None)]
    if near:
        return near
    return [i for i, f in enumerate(counters) if f.kind == "load_imbalance"
            and f.node == t.node and (t.gpu is None or f.gpu in (None, t.gpu))]


def explains(counters: list[Finding], open_kinds: set[str] | frozenset[str] = frozenset()
             ) -> bool:
    """Whether the counters' findings of the bin, or the incidents still open
    (``open_kinds``), explain a slowdown of the job's steps."""
    return any(f.kind in EXPLAINING for f in counters) or bool(open_kinds & EXPLAINING)


def merge(counters: list[Finding], timings: list[Finding],
          look: Callable[[str, str | None], dict[str, Any] | None],
          counters_speak: bool) -> list[Finding]:
    """One list of findings for the bin. ``look(node, gpu)``: what the timings say of
    a place (``StepDetector.rank_view``), None where they do not cover it;
    ``counters_speak``: the job's counters were read."""
    out = list(counters)
    extra: list[Finding] = []
    for t in timings:
        same = _same_fault(counters, t)
        if same:
            for i in same:
                out[i] = _measured(out[i], t)
            continue
        if t.kind == "slowdown" and (t.evidence.get("explained") or explains(counters)):
            costed = [i for i, f in enumerate(out) if is_costed(f)]
            if len(costed) == 1:  # the one fault the slowdown is
                out[costed[0]] = _measured(out[costed[0]], t)
            continue
        ev = {**t.evidence, "sources": ["timings"],
              "agree": False if counters_speak else None}
        if t.kind == "straggler":
            ev["remediable"] = False
        extra.append(dataclasses.replace(t, evidence=ev))
    for i, f in enumerate(out):
        if f.kind != "straggler" or "sources" in f.evidence or f.node is None:
            continue
        seen = look(f.node, f.gpu)
        if seen is None:
            continue
        # the timings cover this place: is it slower than its peers there?
        ev = {**f.evidence, "sources": ["counters", "timings"] if seen["slower"]
              else ["counters"], "agree": bool(seen["slower"]),
              "timings": {k: v for k, v in seen.items() if k not in ("slower", "job_slowdown")}}
        if seen["job_slowdown"] is not None:  # measured while the timings flagged it
            ev.update(cost_fields(int(f.evidence.get("job_gpus") or 0), seen["job_slowdown"],
                                  "steps"))
        out[i] = dataclasses.replace(f, evidence=ev)
    return out + extra
