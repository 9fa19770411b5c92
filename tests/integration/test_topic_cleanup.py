"""Benchmarks and soak runs delete their own topics when they end (a soak's samples
topic holds ~31 GB); nothing else is touched."""

from __future__ import annotations

import time

import pytest
from kafka.admin import KafkaAdminClient

from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.vigil.ops.kafka_admin import delete_topics_starting, ensure_topics

pytestmark = pytest.mark.integration


def _names(cfg: Config, gone: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """The broker's topic names, once none of ``gone`` is listed (a deletion reaches
    the broker's metadata a moment after the controller answers) or after 10 s."""
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    try:
        deadline = time.monotonic() + 10
        names = set(admin.list_topics())
        while names & gone and time.monotonic() < deadline:
            time.sleep(0.2)
            names = set(admin.list_topics())
        return names
    finally:
        admin.close()


def test_only_the_runs_own_topics_are_deleted(isolated_env: dict[str, str],
                                              isolated_cfg: Config) -> None:
    other = load(env=dict(isolated_env,
                          VIGIL_KAFKA_TOPIC_PREFIX=isolated_cfg.kafka.topic_prefix + "x."))
    ensure_topics(isolated_cfg)
    ensure_topics(other)
    mine = {t for t in _names(isolated_cfg) if t.startswith(isolated_cfg.kafka.topic_prefix)}
    kept = {t for t in _names(other) if t.startswith(other.kafka.topic_prefix)}
    assert mine > kept and kept  # both runs' topics exist; the other's names extend ours
    # the other run's prefix is the narrower one: deleting it leaves ours
    assert set(delete_topics_starting(other, (other.kafka.topic_prefix,))) == kept
    left = _names(isolated_cfg, gone=kept)
    assert not left & kept and mine - kept <= left
    assert set(delete_topics_starting(isolated_cfg, (isolated_cfg.kafka.topic_prefix,))) \
        == mine - kept


def test_an_empty_prefix_is_refused() -> None:
    cfg = load(env={})
    with pytest.raises(ValueError):
        delete_topics_starting(cfg, ("",))
    with pytest.raises(ValueError):
        delete_topics_starting(cfg, ())
