"""Turn per-evaluation findings into incidents: persistence before firing,
hysteresis before resolving, and ids that stay stable from firing to resolved.

The tracker's whole state is a JSON-able dict, so the stream worker keeps it in a
changelogged table and a restarted worker neither loses an incident nor fires it
twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import statistics
from typing import Any

from vigil_gpu_monitor.contracts import DETECTION_SCHEMA
from vigil_gpu_monitor.contracts.messages import Detection
from vigil_gpu_monitor.detectors.cost import cost_fields
from vigil_gpu_monitor.detectors.findings import Finding

log = logging.getLogger(__name__)

COST_HISTORY = 240  # estimates (20 min of 5 s steps) the resolved cost is the median of


def incident_id(job: str, key: str, started_at: float) -> str:
    """Deterministic id of one incident: job, condition and the time it began."""
    digest = hashlib.sha1(f"{job}|{key}|{started_at:.3f}".encode()).hexdigest()
    return f"{key.split('|', 1)[0]}-{digest[:16]}"


class IncidentTracker:
    """Per-job incident bookkeeping keyed by ``Finding.key``."""

    def __init__(self, job: str, fire_after: int, resolve_after: int,
                 state: dict[str, Any] | None = None) -> None:
        self.job = job
        self.fire_after = fire_after
        self.resolve_after = resolve_after
        self.conditions: dict[str, dict[str, Any]] = (state or {}).get("conditions", {})

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for a table or a checkpoint."""
        return {"conditions": self.conditions}

    def open_incidents(self) -> list[Detection]:
        """The firing detections that have not resolved yet."""
        return [c["detection"] for c in self.conditions.values() if c.get("firing")]

    def update(self, now: float, findings: list[Finding], kinds: set[str]) -> list[Detection]:
        """Apply one evaluation at event time ``now`` covering detection ``kinds``.

        Conditions of those kinds that are not among ``findings`` count towards
        resolving. Returns the detections to publish (firing and resolved).
        """
        out: list[Detection] = []
        seen = {f.key: _finite(f) for f in findings}
        for key, finding in seen.items():
            cond = self.conditions.setdefault(
                key, {"on": 0, "off": 0, "firing": False, "since": finding.since})
            cond["on"] += 1
            cond["off"] = 0
            need = finding.fire_after if finding.fire_after is not None else self.fire_after
            # a finding without this bin's readings (``evidence.unread``) keeps its
            # incident open but does not open one: a firing carries numbers
            if not cond["firing"] and cond["on"] >= need and not finding.evidence.get("unread"):
                cond["firing"] = True
                det = self._detection(finding, key, cond["since"], now, "firing")
                cond["detection"] = det
                out.append(det)
            if cond["firing"]:
                _track_cost(cond, finding)
            if finding.resolve_after is not None:
                cond["resolve_after"] = finding.resolve_after
        for key in [k for k in self.conditions if k not in seen]:
            if key.split("|", 1)[0] not in kinds:
                continue
            cond = self.conditions[key]
            if not cond["firing"]:
                del self.conditions[key]
                continue
            cond["off"] += 1
            cond["on"] = 0
            if cond["off"] >= cond.get("resolve_after", self.resolve_after):
                fired: Detection = cond["detection"]
                resolved: Detection = {**fired, "state": "resolved", "detected_at": now,
                                       "summary": "Resolved: " + fired["summary"]}
                out.append(resolved)
                del self.conditions[key]
        return out

    def _detection(self, f: Finding, key: str, since: float, now: float,
                   state: str) -> Detection:
        return {
            "schema": DETECTION_SCHEMA,
            "id": incident_id(self.job, key, since),
            "kind": f.kind,
            "state": state,
            "severity": f.severity,
            "job": self.job,
            "node": f.node,
            "gpu": f.gpu,
            "started_at": round(since, 3),
            "detected_at": round(now, 3),
            "metrics": list(f.metrics),
            "score": round(f.score, 3),
            "summary": f.summary,
            "evidence": f.evidence,
        }


def _finite(finding: Finding) -> Finding:
    """The finding with any non-finite number in its evidence made null (unknown), and
    an error logged: a NaN there is a detector's bug, and the detection contract
    refuses it, so sent on it would stop the worker (and ``vigil replay``) at every
    restart on the same samples. The detection still goes out."""
    bad: list[str] = []
    clean = _finite_value(finding.evidence, "evidence", bad)
    if not bad:
        return finding
    log.error("%s %s: non-finite %s made null (a detector bug)", finding.kind,
              finding.node, ", ".join(bad))
    return dataclasses.replace(finding, evidence=clean)


def _finite_value(value: Any, path: str, bad: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(path)
        return None
    if isinstance(value, dict):
        return {k: _finite_value(v, f"{path}.{k}", bad) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_value(v, f"{path}[{i}]", bad) for i, v in enumerate(value)]
    return value


def _track_cost(cond: dict[str, Any], finding: Finding) -> None:
    """Keep the incident's recent cost estimates; the held detection (what its resolved
    message copies) carries their median: the typical cost while it was open, not the
    last evaluations', which see the fault fading."""
    ev = finding.evidence
    if ev.get("job_slowdown") is None:
        return
    history: list[float] = cond.setdefault("costs", [])
    history.append(float(ev["job_slowdown"]))
    del history[:-COST_HISTORY]
    fired: Detection = cond["detection"]
    typical = cost_fields(int(ev.get("job_gpus") or 0), statistics.median(history),
                          str(ev.get("cost_basis")))
    cond["detection"] = {**fired, "evidence": {**fired["evidence"], **typical}}
