"""Redis live state: idempotent, ordered writes against a real Redis."""

from __future__ import annotations

import pytest
import redis

from alerting.state import LiveState
from contracts.config import Config

pytestmark = pytest.mark.integration


def _det(state: str, at: float, ident: str = "straggler-abc") -> dict[str, object]:
    return {"schema": "vigil.detection/1", "id": ident, "kind": "straggler", "state": state,
            "severity": "warning", "job": "job-7", "node": "n1", "gpu": "3", "started_at": 10.0,
            "detected_at": at, "metrics": ["sm_active"], "score": 6.0, "summary": "s",
            "evidence": {}}


def test_duplicates_and_stale_detections_change_nothing(isolated_cfg: Config) -> None:
    state = LiveState(redis.Redis.from_url(isolated_cfg.redis_url), isolated_cfg.redis.key_prefix)
    assert state.apply(_det("firing", 20.0)) is True
    assert state.apply(_det("firing", 20.0)) is False  # Kafka redelivery
    assert [d["id"] for d in state.open_incidents("job-7")] == ["straggler-abc"]
    assert state.apply(_det("resolved", 60.0)) is True
    assert state.apply(_det("firing", 20.0)) is False  # older, replayed late
    assert state.open_incidents() == []
    assert [d["state"] for d in state.history()] == ["resolved", "firing"]


def test_fleet_view_spans_jobs(isolated_cfg: Config) -> None:
    state = LiveState(redis.Redis.from_url(isolated_cfg.redis_url), isolated_cfg.redis.key_prefix)
    a = _det("firing", 5.0, "straggler-a")
    b = dict(_det("firing", 6.0, "straggler-b"), job="job-8")
    assert state.apply(a) and state.apply(b)
    assert sorted(d["job"] for d in state.open_incidents()) == ["job-7", "job-8"]
    assert state.r.ttl(state.incident_key("job-8", "straggler-b")) > 0
