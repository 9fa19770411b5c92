"""What a detection asks remediation for (issue #28): a straggler with a work or clock
signature is cordoned after the wait; one nothing but busy time speaks for, a load
imbalance and a slowdown never are."""

from __future__ import annotations

from typing import Any

from vigil_gpu_monitor.alerting.remediation import plan
from vigil_gpu_monitor.contracts.config import AlerterConfig


def _det(kind: str, node: str | None = "n1", **evidence: Any) -> dict[str, Any]:
    return {"schema": "vigil.detection/1", "id": f"{kind}-1", "kind": kind,
            "state": "firing", "severity": "info" if kind == "load_imbalance" else "warning",
            "job": "j", "node": node, "gpu": "3" if node else None, "started_at": 0.0,
            "detected_at": 10.0, "metrics": ["sm_active"], "score": 5.0, "summary": "s",
            "evidence": evidence}


def test_only_stragglers_that_can_be_told_from_work_are_cordoned() -> None:
    cfg = AlerterConfig()
    assert plan(_det("straggler", work_basis="tensor_active", remediable=True),  # type: ignore[arg-type]
                cfg) == ("cordon", max(cfg.confirm_seconds, cfg.straggler_cordon_after_seconds))
    assert plan(_det("straggler", work_basis="none", remediable=False), cfg) is None  # type: ignore[arg-type]
    assert plan(_det("load_imbalance", share_above_peers=0.3), cfg) is None  # type: ignore[arg-type]
    assert plan(_det("slowdown", node=None, candidates=[{"node": "n1"}]), cfg) is None  # type: ignore[arg-type]
