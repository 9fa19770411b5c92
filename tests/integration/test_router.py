"""Router timing rules with a real Redis behind silences and acks."""

from __future__ import annotations

import pytest
import redis

from tests.alerting.test_delivery import det
from vigil_gpu_monitor.alerting.router import Route, Router
from vigil_gpu_monitor.alerting.silences import SilenceStore
from vigil_gpu_monitor.contracts.config import Config

pytestmark = pytest.mark.integration


def _router(cfg: Config, **kw: float) -> Router:
    store = SilenceStore(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    routes = {"am": Route(resend=True), "pd": Route(pager=True)}
    return Router(routes, store, **kw)  # type: ignore[arg-type]


def test_alertmanager_is_re_sent_while_firing(isolated_cfg: Config) -> None:
    router = _router(isolated_cfg, page_after_seconds=1000, resend_seconds=60)
    assert router.handle(det(), now=0) == [("am", det())]
    assert router.tick(now=30) == []
    assert router.tick(now=61) == [("am", det())]
    assert router.tick(now=62) == []
    assert router.handle(det("resolved"), now=70) == [("am", det("resolved"))]
    assert router.tick(now=200) == []


def test_flapping_condition_stops_notifying(isolated_cfg: Config) -> None:
    router = _router(isolated_cfg, page_after_seconds=0, flap_max=3, flap_window=600)
    sent = []
    for k in range(6):
        sent += router.handle(det(ident=f"flap-{k}"), now=k * 20)
        sent += router.tick(now=k * 20)
        sent += router.handle(det("resolved", ident=f"flap-{k}"), now=k * 20 + 10)
    fired = [d["id"] for channel, d in sent if channel == "pd" and d["state"] == "firing"]
    assert fired == ["flap-0", "flap-1", "flap-2"]
    assert router.suppressed["flap-3"] == "flapping"
