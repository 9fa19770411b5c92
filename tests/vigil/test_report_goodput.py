"""The report's GPU-hours-lost plot adds up the incidents as the ledger does."""

from __future__ import annotations

import numpy as np
import pytest

from vigil_gpu_monitor.contracts.messages import Detection
from vigil_gpu_monitor.vigil.views.report_goodput import lost_by_kind

T0 = 1_800_000_000.0


def _det(ident: str, kind: str, state: str, at: float, rate: float | None,
         **evidence: object) -> Detection:
    return {"schema": "vigil.detection/1", "id": ident, "kind": kind, "state": state,
            "severity": "warning", "job": "j", "node": "n", "gpu": None,
            "started_at": T0 + 100, "detected_at": at, "metrics": [], "score": 1.0,
            "summary": "s", "evidence": {"gpu_hours_lost_per_hour": rate, **evidence}}


def test_each_cause_costs_its_rate_for_as_long_as_it_lasted() -> None:
    dets = [_det("a", "straggler", "firing", T0 + 110, 4.0),
            _det("h", "hang", "firing", T0 + 200, None, cost_basis="hang", job_gpus=16),
            _det("a", "straggler", "resolved", T0 + 1900, 2.0)]  # resolved at its median
    series = lost_by_kind(dets, T0, 10.0, 360)  # one hour of 10 s bins
    assert series["straggler"][-1] == pytest.approx(2.0 * 1800 / 3600)
    assert series["hang"][-1] == pytest.approx(16.0 * 3500 / 3600)  # open to the end
    assert np.all(np.diff(series["straggler"]) >= 0) and series["straggler"][5] == 0.0
