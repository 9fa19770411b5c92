"""The static-rules baseline: what dcgm-exporter + Prometheus users alert on today.

Rules (per GPU): XID ≠ 0; ECC double-bit errors > 0; temperature > 85 °C for 1 m;
thermal or hardware slowdown for 1 m; PCIe width < 16. It is evaluated on every
sample (kinder to it than a 15–30 s scrape-and-evaluate cycle), and exists only so
`vigil bench detect` can compare both on the same traces.
"""

from __future__ import annotations

from typing import Any

from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.detectors.health import SLOWDOWN_BITS

FOR_SECONDS = 60.0


class StaticRules:
    """Fires (kind, node, gpu) once per rule the first time the rule holds."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, str, str], float] = {}
        self.fired: set[tuple[str, str, str]] = set()

    def feed(self, sample: Sample) -> list[dict[str, Any]]:
        """Detections (as minimal dicts) that this sample makes fire."""
        ts, node = sample["ts"], sample["node"]
        out = []
        for gpu, r in sample["gpus"].items():
            rules = {
                "xid": (r.get("xid", 0) or 0) != 0, "ecc": (r.get("ecc_dbe", 0) or 0) > 0,
                "temp": (r.get("temperature", 0) or 0) > 85,
                "slowdown": int(r.get("throttle", 0) or 0) & SLOWDOWN_BITS != 0,
                "pcie": r.get("pcie_width", 16) < 16,
            }
            for rule, holds in rules.items():
                key = (rule, node, gpu)
                if not holds:
                    self.pending.pop(key, None)
                    continue
                since = self.pending.setdefault(key, ts)
                hold = FOR_SECONDS if rule in ("temp", "slowdown") else 0.0
                if key not in self.fired and ts - since >= hold:
                    self.fired.add(key)
                    out.append({"kind": "link_health" if rule == "pcie" else "gpu_health",
                                "state": "firing", "job": sample["job"], "node": node,
                                "gpu": gpu, "detected_at": ts, "rule": rule})
        return out
