"""GPU health and silent nodes, from per-sample state (not bin means).

- XID errors are classified (replace the GPU, reset it, the application's fault, or
  investigate) and fire on the sample that carries them.
- A rise of the volatile double-bit ECC counter fires on its sample too. The first
  count seen of a GPU is its baseline, not news: the counter holds every error since
  the driver loaded, so a count already there when a GPU joins a job, or when an agent
  or exporter starts, is history.
- Thermal / hardware slowdown clock-event reasons held for ``throttle_seconds``.
- A GPU that stops appearing in its node's samples while the node still reports.
- ``node_silent``: a node of the job stops reporting for ``silent_seconds`` while
  the job's other nodes go on (when every node stops, the job ended).

Events stay open for ``hold_seconds`` after they were last seen, then resolve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.messages import Sample
from detectors.findings import Finding

# XID → (action, severity, meaning). From NVIDIA's XID catalogue; unknown codes
# are "investigate".
XID_CLASSES: dict[int, tuple[str, str, str]] = {
    13: ("application", "info", "graphics engine exception, usually the application"),
    31: ("application", "info", "GPU memory page fault, usually the application"),
    43: ("application", "info", "GPU stopped processing, usually the application"),
    45: ("application", "info", "preemptive cleanup after an earlier fault"),
    48: ("replace", "critical", "double-bit ECC error"),
    61: ("reset", "warning", "internal micro-controller breakpoint"),
    62: ("reset", "critical", "internal micro-controller halt"),
    63: ("investigate", "warning", "ECC page retirement or row remapping recorded"),
    64: ("replace", "critical", "ECC page retirement or row remapping failed"),
    74: ("reset", "critical", "NVLink error"),
    79: ("replace", "critical", "GPU has fallen off the bus"),
    92: ("investigate", "warning", "high single-bit ECC error rate"),
    94: ("reset", "critical", "contained ECC error"),
    95: ("replace", "critical", "uncontained ECC error"),
    119: ("reset", "critical", "GSP RPC timeout"),
    120: ("reset", "critical", "GSP error"),
    140: ("replace", "critical", "unrecovered ECC error"),
}
ACTION_ADVICE = {"replace": "drain the node and replace the GPU", "reset": "reset the GPU",
                 "application": "check the application", "investigate": "investigate"}
# HW slowdown, SW thermal, HW thermal, HW power brake
SLOWDOWN_BITS = 0x8 | 0x20 | 0x40 | 0x80
FORGET_SECONDS = 3600.0


@dataclass(frozen=True)
class HealthParams:
    """Timers of the health and silence checks (event-time seconds)."""

    throttle_seconds: float = 15.0
    missing_gpu_seconds: float = 10.0
    silent_seconds: float = 20.0
    hold_seconds: float = 300.0


def classify_xid(code: int) -> tuple[str, str, str]:
    """(action, severity, meaning) of an XID code."""
    return XID_CLASSES.get(code, ("investigate", "warning", "unclassified XID"))


class HealthMonitor:
    """Per-GPU and per-node health bookkeeping of one job; JSON-able state."""

    def __init__(self, p: HealthParams, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.p = p
        self.gpus: dict[str, dict[str, Any]] = state.get("gpus", {})
        self.nodes: dict[str, float] = state.get("nodes", {})

    def to_state(self) -> dict[str, Any]:
        """JSON-able state for a table or a checkpoint."""
        return {"gpus": self.gpus, "nodes": self.nodes}

    def forget_node(self, node: str) -> None:
        """The node left the job: no silence or missing GPU is judged for it."""
        self.nodes.pop(node, None)
        for key in [k for k in self.gpus if k.rsplit("/", 1)[0] == node]:
            del self.gpus[key]

    def heard(self, sample: Sample) -> None:
        """A sample too late for the window still says its node and GPUs are alive
        (a node whose clock just jumped back is not silent); nothing else of it is
        used."""
        ts, node = sample["ts"], sample["node"]
        self.nodes[node] = max(ts, self.nodes.get(node, ts))
        for gpu in sample["gpus"]:
            g = self.gpus.get(f"{node}/{gpu}")
            if g is not None:
                g["last"] = max(ts, g["last"])

    def ingest(self, sample: Sample) -> list[Finding]:
        """Fold one sample in; return findings that must fire on this very sample."""
        ts, node = sample["ts"], sample["node"]
        self.nodes[node] = max(ts, self.nodes.get(node, ts))
        out = []
        for gpu, r in sample["gpus"].items():
            g = self.gpus.setdefault(f"{node}/{gpu}", {"last": ts, "thr": None})
            g["last"] = max(ts, g["last"])
            xid = int(r.get("xid", 0) or 0)
            if xid:
                action, severity, meaning = classify_xid(xid)
                g["event"] = {"ts": ts, "metric": "xid", "severity": severity,
                              "text": f"XID {xid} ({meaning}): {ACTION_ADVICE[action]}",
                              "xid": xid, "action": action}
                out.append(self._event_finding(node, gpu, g))
            dbe = r.get("ecc_dbe")
            if dbe is not None:
                # the first count seen of a GPU is its baseline: errors from before Vigil
                # watched it (volatile counts live until the driver reloads) are history
                if dbe > g.get("dbe", dbe) and not (g.get("event", {}).get("ts") == ts):
                    g["event"] = {"ts": ts, "metric": "ecc_dbe", "severity": "critical",
                                  "text": f"double-bit ECC errors rose to {dbe:.0f}: "
                                          f"{ACTION_ADVICE['replace']}", "action": "replace"}
                    out.append(self._event_finding(node, gpu, g))
                g["dbe"] = dbe
            throttle = r.get("throttle")
            if throttle is not None:
                bad = int(throttle) & SLOWDOWN_BITS
                g["thr"] = (g["thr"] if g["thr"] is not None else ts) if bad else None
                g["thr_bits"] = bad
        return out

    def _event_finding(self, node: str, gpu: str, g: dict[str, Any]) -> Finding:
        ev = g["event"]
        return Finding("gpu_health", node, gpu, ev["severity"], (ev["metric"],),
                       10.0 if ev["severity"] == "critical" else 5.0,
                       f"GPU {gpu} on {node}: {ev['text']}.", ev["ts"],
                       {k: v for k, v in ev.items() if k != "text"}, fire_after=1)

    def evaluate(self, now: float) -> tuple[list[Finding], list[Finding]]:
        """(gpu_health, node_silent) findings at event time ``now``."""
        p = self.p
        for key in [k for k, g in self.gpus.items() if now - g["last"] > FORGET_SECONDS]:
            del self.gpus[key]
        for node in [n for n, t in self.nodes.items() if now - t > FORGET_SECONDS]:
            del self.nodes[node]
        health: list[Finding] = []
        for key, g in sorted(self.gpus.items()):
            node, gpu = key.rsplit("/", 1)
            node_last = self.nodes.get(node, g["last"])
            ev = g.get("event")
            if ev and now - ev["ts"] <= p.hold_seconds:
                health.append(self._event_finding(node, gpu, g))
            elif g["thr"] is not None and now - g["thr"] >= p.throttle_seconds:
                health.append(Finding(
                    "gpu_health", node, gpu, "warning", ("throttle",), now - g["thr"],
                    f"GPU {gpu} on {node} has been slowed by thermal or hardware slowdown "
                    f"for {now - g['thr']:.0f}s (clock-event reasons {g['thr_bits']:#x}).",
                    g["thr"], {"throttle_bits": g["thr_bits"], "seconds": now - g["thr"]}))
            elif (now - g["last"] >= p.missing_gpu_seconds
                  and now - node_last < p.missing_gpu_seconds / 2):
                health.append(Finding(
                    "gpu_health", node, gpu, "critical", ("gpu_util",), now - g["last"],
                    f"GPU {gpu} on {node} stopped answering {now - g['last']:.0f}s ago while "
                    f"its node still reports: it may have fallen off the bus.", g["last"],
                    {"last_seen": g["last"]}, fire_after=1))
        silent: list[Finding] = []
        active = [n for n, t in self.nodes.items() if now - t < p.silent_seconds]
        if active:
            for node, last in sorted(self.nodes.items()):
                if now - last >= p.silent_seconds:
                    silent.append(Finding(
                        "node_silent", node, None, "critical", (), now - last,
                        f"Node {node} has sent nothing for {now - last:.0f}s while "
                        f"{len(active)} other node(s) of the job still report.", last,
                        {"last_seen": last, "reporting_nodes": len(active)}, fire_after=1))
        return health, silent
