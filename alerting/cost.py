"""What each incident costs, where decisions are made: the text people read,
escalation by cost, ordering, and the running total of GPU-hours lost.

The estimate itself is made by the detectors (``detectors/cost.py``) and travels in
``evidence`` (``job_slowdown``, ``job_gpus``, ``gpu_hours_lost_per_hour``,
``cost_basis``); this module only reads it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from vigil_gpu_monitor.contracts.messages import Detection


def lost_per_hour(det: Detection) -> float | None:
    """GPU-hours the incident's job loses per hour, or None when not estimated."""
    value = det["evidence"].get("gpu_hours_lost_per_hour")
    return float(value) if isinstance(value, int | float) else None


def cost_text(det: Detection) -> str:
    """``"costing about 7.4 GPU-hours per hour (job 9 % slower)"``; empty when the
    detection carries no estimate."""
    lost = lost_per_hour(det)
    if lost is None:
        return ""
    ev = det["evidence"]
    if ev.get("cost_basis") == "hang":
        return f"costing about {lost:.3g} GPU-hours per hour (the whole job is stalled)"
    slowdown = ev.get("job_slowdown")
    bound = " at most" if ev.get("cost_basis") == "blamed" else ""
    return (f"costing{bound} about {lost:.3g} GPU-hours per hour "
            f"(job {100 * float(slowdown or 0):.0f} % slower)")


def with_cost(summary: str, det: Detection) -> str:
    """The summary with its cost sentence appended, if there is one."""
    text = cost_text(det)
    return f"{summary} {text[0].upper()}{text[1:]}." if text else summary


def escalate_on_cost(det: Detection, page_gpu_hours_per_hour: float,
                     force: bool = False) -> Detection:
    """A copy raised to ``critical`` when its cost reaches the paging threshold
    (0 turns this off) or ``force`` is set; ``evidence.escalated_on_cost`` records
    the threshold."""
    lost = lost_per_hour(det)
    if det["severity"] == "critical" or not force and (
            page_gpu_hours_per_hour <= 0 or lost is None or lost < page_gpu_hours_per_hour):
        return det
    return {**det, "severity": "critical",
            "evidence": {**det["evidence"], "escalated_on_cost": page_gpu_hours_per_hour}}


def by_cost(detections: list[Detection]) -> list[Detection]:
    """Costliest first; those without an estimate after, newest first among equals."""
    return sorted(detections, key=lambda d: (-(lost_per_hour(d) or -1.0), -d["detected_at"]))


@dataclass
class _Open:
    job: str
    kind: str
    rate: float  # GPU-hours per hour
    since: float
    gpus: int  # the job's GPU count
    accrued: float = 0.0  # what was already reported for it


@dataclass
class CostLedger:
    """GPU-hours lost per (job, kind): closed incidents' totals plus the open ones'
    accrual up to now (event time of their start to the wall clock), never falling,
    so it can be exported as a Prometheus counter."""

    closed: dict[tuple[str, str], float] = field(default_factory=dict)
    open: dict[str, _Open] = field(default_factory=dict)

    def apply(self, det: Detection) -> None:
        """Account a firing or resolved detection (duplicates are harmless)."""
        rate = lost_per_hour(det)
        if det["state"] == "firing":
            if rate is not None and det["id"] not in self.open:
                self.open[det["id"]] = _Open(det["job"], det["kind"], rate, det["started_at"],
                                             int(det["evidence"].get("job_gpus") or 0))
            return
        known = self.open.pop(det["id"], None)
        if known is None and rate is None:
            return
        final_rate = rate if rate is not None else known.rate  # type: ignore[union-attr]
        hours = max(0.0, det["detected_at"] - det["started_at"]) / 3600 * final_rate
        hours = max(hours, known.accrued if known else 0.0)
        key = (det["job"], det["kind"])
        self.closed[key] = self.closed.get(key, 0.0) + hours

    def totals(self, now: float | None = None) -> dict[tuple[str, str], float]:
        """(job, kind) → GPU-hours lost so far."""
        now = time.time() if now is None else now
        out = dict(self.closed)
        for inc in self.open.values():
            inc.accrued = max(inc.accrued, max(0.0, now - inc.since) / 3600 * inc.rate)
            out[inc.job, inc.kind] = out.get((inc.job, inc.kind), 0.0) + inc.accrued
        return out

    def losing_now(self) -> dict[str, float]:
        """job → GPU-hours per hour lost to its open incidents now."""
        out: dict[str, float] = {}
        for inc in self.open.values():
            out[inc.job] = out.get(inc.job, 0.0) + inc.rate
        return out


def goodput(job_gpus: int, lost: float) -> float:
    """The share of a job's GPU time not lost (0..1)."""
    return 1.0 if job_gpus <= 0 else max(0.0, 1.0 - lost / job_gpus)
