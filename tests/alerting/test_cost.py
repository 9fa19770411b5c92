"""Cost where decisions are made: texts, escalation, ordering, the GPU-hours ledger."""

from __future__ import annotations

from typing import Any

import pytest

from tests.alerting.http_recorder import Recorder
from tests.alerting.test_delivery import det
from vigil_gpu_monitor.alerting.channels import AlertmanagerChannel, PagerDutyChannel, SlackChannel
from vigil_gpu_monitor.alerting.cost import (
    CostLedger,
    by_cost,
    cost_text,
    escalate_on_cost,
    with_cost,
)
from vigil_gpu_monitor.contracts.config import Secret


def costly(ident: str = "straggler-1", lost: float | None = 7.4, slowdown: float = 0.09,
           gpus: int = 90, basis: str = "baseline", **kw: Any) -> dict[str, Any]:
    d = det(ident=ident, severity="warning", **kw)
    d["evidence"] = {"job_slowdown": slowdown, "job_gpus": gpus,
                     "gpu_hours_lost_per_hour": lost, "cost_basis": basis}
    return d


def test_cost_sentence() -> None:
    assert cost_text(costly()) == "costing about 7.4 GPU-hours per hour (job 9 % slower)"
    assert "at most" in cost_text(costly(basis="blamed"))
    hang = costly(lost=64.0, basis="hang")
    hang["evidence"]["job_slowdown"] = None
    assert cost_text(hang) == "costing about 64 GPU-hours per hour (the whole job is stalled)"
    assert cost_text(costly(lost=None)) == "" and cost_text(det()) == ""
    assert with_cost("GPU 3 is slow.", costly()).endswith(
        "slow. Costing about 7.4 GPU-hours per hour (job 9 % slower).")


def test_escalation_on_cost_and_its_off_switch() -> None:
    cheap, dear = costly(lost=2.0), costly(lost=9.0)
    assert escalate_on_cost(cheap, 8.0) is cheap
    raised = escalate_on_cost(dear, 8.0)
    assert raised["severity"] == "critical" and raised["evidence"]["escalated_on_cost"] == 8.0
    assert dear["severity"] == "warning"  # a copy: the input is not changed
    assert escalate_on_cost(dear, 0.0) is dear
    assert escalate_on_cost(cheap, 8.0, force=True)["severity"] == "critical"


def test_costliest_first_unknown_last() -> None:
    dets = [costly("a", lost=1.0), costly("b", lost=None), costly("c", lost=30.0), det()]
    assert [d["id"] for d in by_cost(dets)][:2] == ["c", "a"]


def test_ledger_counts_open_time_and_never_falls() -> None:
    ledger = CostLedger()
    fire = dict(costly(lost=6.0), started_at=0.0, detected_at=30.0)
    ledger.apply(fire)
    ledger.apply(fire)  # a redelivery
    assert ledger.totals(now=1800.0)[("job-7", "straggler")] == pytest.approx(3.0)
    assert ledger.losing_now() == {"job-7": 6.0}
    # resolved at 1700 s with a lower final rate: the counter keeps what it reported
    end = dict(costly(lost=4.0), state="resolved", started_at=0.0, detected_at=1700.0)
    ledger.apply(end)
    assert ledger.totals(now=9999.0)[("job-7", "straggler")] == pytest.approx(3.0)
    assert ledger.losing_now() == {}
    later = dict(costly("s-2", lost=12.0), started_at=0.0, detected_at=10.0)
    ledger.apply(later)
    ledger.apply(dict(later, state="resolved", detected_at=3600.0))
    assert ledger.totals(now=0.0)[("job-7", "straggler")] == pytest.approx(15.0)


def test_channels_say_what_it_costs() -> None:
    with Recorder() as rec:
        SlackChannel(Secret(rec.url + "/hook")).send(costly())
        PagerDutyChannel(Secret("rk"), url=rec.url + "/v2/enqueue").send(costly())
        AlertmanagerChannel(rec.url).send(costly())
    slack, pager, am = (r.json() for r in rec.requests)
    assert "Costing about 7.4 GPU-hours per hour (job 9 % slower)." in slack["text"]
    assert "Costing about 7.4 GPU-hours per hour" in pager["payload"]["summary"]
    annotations = am[0]["annotations"]
    assert annotations["gpu_hours_lost_per_hour"] == "7.4"
    assert annotations["cost"].startswith("costing about 7.4")
    assert "7.4" not in "".join(am[0]["labels"].values())  # labels stay the alert's identity
