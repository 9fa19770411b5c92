"""Fixtures for tests that talk to the real Kafka and Redis started by `make test`.

They fail (never skip) when the services are unreachable: `make test` starts them,
or VIGIL_KAFKA_BOOTSTRAP / VIGIL_REDIS_URL name existing ones.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator

import pytest
import redis

from vigil_gpu_monitor.contracts.config import Config, load


def _reachable(hostport: str) -> bool:
    host, _, port = hostport.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def isolated_env() -> Iterator[dict[str, str]]:
    """Environment for subprocesses: this test's own topics, app id, group and keys."""
    tag = uuid.uuid4().hex[:8]
    env = dict(os.environ)
    env.update({"VIGIL_KAFKA_TOPIC_PREFIX": f"t{tag}.", "VIGIL_WORKER_APP_ID": f"w{tag}",
                "VIGIL_ALERTER_GROUP_ID": f"a{tag}", "VIGIL_REDIS_KEY_PREFIX": f"t{tag}",
                "VIGIL_WORKER_DATA_DIR": f".vigil/test-worker/{tag}",
                "VIGIL_WORKER_WEB_PORT": "0", "VIGIL_ALERTER_METRICS_PORT": "0"})
    cfg = load(env=env)
    assert _reachable(cfg.kafka_bootstrap), (
        f"Kafka {cfg.kafka_bootstrap} unreachable: run `make test` (it starts the stack)")
    assert redis.Redis.from_url(cfg.redis_url).ping()
    yield env
    r = redis.Redis.from_url(cfg.redis_url)
    for key in r.scan_iter(match=f"t{tag}:*"):
        r.delete(key)


@pytest.fixture
def isolated_cfg(isolated_env: dict[str, str]) -> Config:
    return load(env=isolated_env)
