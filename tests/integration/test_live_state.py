"""Redis live state: idempotent, ordered writes against a real Redis."""

from __future__ import annotations

import pytest
import redis

from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts.config import Config

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


def test_node_and_gpu_status_follow_incidents(isolated_cfg: Config) -> None:
    state = LiveState(redis.Redis.from_url(isolated_cfg.redis_url), isolated_cfg.redis.key_prefix)
    gpu = _det("firing", 5.0, "straggler-g")
    node = dict(_det("firing", 6.0, "link-n"), kind="link_health", gpu=None)
    job = dict(_det("firing", 7.0, "hang-j"), kind="hang", node=None, gpu=None)
    for d in (gpu, node, job):
        assert state.apply(d)
    assert state.open_by_location("job-7") == {"n1/3": ["straggler-g"], "n1": ["link-n"],
                                               "-": ["hang-j"]}
    assert state.apply(dict(gpu, state="resolved", detected_at=9.0))
    assert state.apply(dict(gpu, state="resolved", detected_at=9.0)) is False
    assert state.open_by_location("job-7") == {"n1": ["link-n"], "-": ["hang-j"]}


def test_acl_user_with_password_in_the_url(isolated_cfg: Config) -> None:
    """Redis AUTH with an ACL user, given the way operators give it: in the URL."""
    import uuid
    from urllib.parse import urlsplit

    admin = redis.Redis.from_url(isolated_cfg.redis_url)
    user, password = f"vigil-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    prefix = isolated_cfg.redis.key_prefix
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", f"~{prefix}:*",
                          "&*", "+@all")
    try:
        parts = urlsplit(isolated_cfg.redis_url)
        url = f"redis://{user}:{password}@{parts.hostname}:{parts.port}/0"
        state = LiveState(redis.Redis.from_url(url), prefix)
        assert state.apply(_det("firing", 1.0, "acl-1"))
        assert [d["id"] for d in state.open_incidents("job-7")] == ["acl-1"]
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(f"redis://{user}:wrong@{parts.hostname}:{parts.port}/0").ping()
        outsider = LiveState(redis.Redis.from_url(url), "someone-else")
        with pytest.raises(redis.exceptions.NoPermissionError):
            outsider.apply(_det("firing", 1.0, "acl-2"))
    finally:
        admin.execute_command("ACL", "DELUSER", user)
