"""Alerting against real Redis, a real Alertmanager and real Kafka."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer

from tests.alerting.http_recorder import Recorder
from tests.alerting.test_delivery import det
from tests.integration.ports import free_port
from vigil_gpu_monitor.alerting.channels import AlertmanagerChannel
from vigil_gpu_monitor.alerting.service import Alerter, build_channels
from vigil_gpu_monitor.alerting.silences import SilenceStore
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_detection
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics
from vigil_gpu_monitor.vigil.ops.localstack import debian_binary

pytestmark = pytest.mark.integration


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """Debian's prometheus-alertmanager on a free loopback port."""
    binary = debian_binary("prometheus-alertmanager", "prometheus-alertmanager")
    config = tmp_path / "am.yml"
    config.write_text('route:\n  receiver: "null"\n  group_wait: 1s\nreceivers:\n'
                      '  - name: "null"\n')
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={config}",
                             f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _am_alerts(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/api/v2/alerts", timeout=5) as resp:
        return list(json.loads(resp.read()))


def test_firing_shows_in_alertmanager_and_leaves_after_resolve(alertmanager: str) -> None:
    channel = AlertmanagerChannel(alertmanager)
    firing = dict(det(), started_at=time.time() - 30, detected_at=time.time())
    channel.send(firing)
    alerts = _am_alerts(alertmanager)
    assert [a["labels"]["incident"] for a in alerts] == ["straggler-1"]
    assert alerts[0]["labels"]["alertname"] == "VigilStraggler"
    assert alerts[0]["labels"]["gpu"] == "3" and alerts[0]["status"]["state"] == "active"
    channel.send(dict(firing, state="resolved", detected_at=time.time()))
    time.sleep(0.5)
    assert _am_alerts(alertmanager) == []


def _publish(cfg: Config, dets: list[dict[str, Any]]) -> None:
    ensure_topics(cfg)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
    for d in dets:
        producer.send(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                      key=d["job"].encode(), value=encode_detection(d))
    producer.flush()
    producer.close()


def _alerter(cfg: Config) -> Alerter:
    consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap, group_id=cfg.alerter.group_id,
                             enable_auto_commit=False, auto_offset_reset="earliest")
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    return Alerter(cfg, consumer, state, build_channels(cfg))


def _run(alerter: Alerter, until: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until():
        alerter.poll_once(timeout_ms=300)


def test_duplicated_and_replayed_detections_page_once(
        isolated_env: dict[str, str], alertmanager: str) -> None:
    now = time.time()
    fire = dict(det(), started_at=now - 60, detected_at=now - 50)
    resolve = dict(fire, state="resolved", detected_at=now - 10)
    with Recorder() as pd, Recorder() as hook:
        cfg = load(env=dict(isolated_env, VIGIL_ALERTER_ALERTMANAGER_URL=alertmanager,
                            VIGIL_ALERTER_PAGERDUTY_ROUTING_KEY="rk",
                            VIGIL_ALERTER_PAGERDUTY_URL=pd.url + "/v2/enqueue",
                            VIGIL_ALERTER_WEBHOOK_URL=hook.url,
                            VIGIL_ALERTER_WEBHOOK_SECRET="k",
                            VIGIL_ALERTER_KAFKA_ALERTS="true",
                            VIGIL_ALERTER_PAGE_AFTER_SECONDS="0"))
        _publish(cfg, [fire, fire, fire])  # redelivered twice
        alerter = _alerter(cfg)
        try:
            _run(alerter, lambda: len(pd.requests) >= 1 and len(hook.requests) >= 1)
            assert [a["labels"]["incident"] for a in _am_alerts(alertmanager)] == [fire["id"]]
            _publish(cfg, [resolve, fire, resolve])  # then a stale replay and a duplicate
            _run(alerter, lambda: len(pd.requests) >= 2 and len(hook.requests) >= 2)
            time.sleep(1.5)
            alerter.poll_once(timeout_ms=300)
        finally:
            alerter.close()
            alerter.consumer.close()
    assert [r.json()["event_action"] for r in pd.requests] == ["trigger", "resolve"]
    assert [r.json()["state"] for r in hook.requests] == ["firing", "resolved"]
    assert _am_alerts(alertmanager) == []
    assert alerter.duplicates == 4 and alerter.applied == 2  # 2 redeliveries, a stale, a dup
    log = alerter.state.deliveries()
    assert {(e["channel"], e["state"], e["result"]) for e in log} == {
        (c, s, "delivered") for c in ("alertmanager", "pagerduty", "webhook", "kafka")
        for s in ("firing", "resolved")}
    consumer = KafkaConsumer(topics.topic(topics.ALERTS, cfg.kafka.topic_prefix),
                             bootstrap_servers=cfg.kafka_bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000)
    assert [json.loads(r.value)["state"] for r in consumer] == ["firing", "resolved"]
    consumer.close()


def test_silence_ack_and_page_delay(isolated_env: dict[str, str]) -> None:
    now = time.time()
    with Recorder() as pd:
        cfg = load(env=dict(isolated_env, VIGIL_ALERTER_PAGERDUTY_ROUTING_KEY="rk",
                            VIGIL_ALERTER_PAGERDUTY_URL=pd.url,
                            VIGIL_ALERTER_PAGERDUTY_ROUTE="severity>=warning",
                            VIGIL_ALERTER_PAGE_AFTER_SECONDS="2"))
        store = SilenceStore(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
        store.add({"job": "job-quiet*"}, 3600, by="test")
        blip = dict(det(ident="blip-1", job="job-b"), detected_at=now)
        blip_end = dict(blip, state="resolved", detected_at=now + 1)
        quiet = dict(det(ident="quiet-1", job="job-quiet-3"), detected_at=now)
        real = dict(det(ident="real-1", job="job-r"), detected_at=now)
        known = dict(det(ident="known-1", job="job-k"), detected_at=now)
        store.ack("known-1", by="oncall")  # acknowledged before the page was due
        _publish(cfg, [blip, blip_end, quiet, real, known])
        alerter = _alerter(cfg)
        try:
            _run(alerter, lambda: alerter.applied >= 5, timeout=20)
            assert pd.requests == [], "paged before page_after_seconds"
            _run(alerter, lambda: len(pd.requests) >= 1, timeout=10)
            time.sleep(1)
            alerter.poll_once(timeout_ms=200)
        finally:
            alerter.close()
            alerter.consumer.close()
    assert [r.json()["dedup_key"] for r in pd.requests] == ["real-1"]
    assert alerter.router.suppressed == {"quiet-1": alerter.router.suppressed["quiet-1"]}
    assert alerter.router.suppressed["quiet-1"].startswith("silenced by")


def test_cli_silence_ack_and_alerts(isolated_env: dict[str, str]) -> None:
    import sys
    vigil = [sys.executable, "-m", "vigil_gpu_monitor"]

    def run(*args: str) -> str:
        return subprocess.run([*vigil, *args], env=isolated_env, check=True, text=True,
                              capture_output=True, timeout=60).stdout

    out = run("silence", "add", "--match", "kind=straggler", "--match", "job=prod-*",
              "--for", "2h", "--comment", "rack 12 maintenance")
    ident = out.split()[-1]
    listing = run("silence", "list")
    assert ident in listing and "kind=straggler" in listing and "rack 12" in listing
    cfg = load(env=isolated_env)
    store = SilenceStore(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    assert store.silenced_by({"kind": "straggler", "job": "prod-4"}) == ident
    assert store.silenced_by({"kind": "hang", "job": "prod-4"}) is None
    run("silence", "expire", ident)
    assert store.silenced_by({"kind": "straggler", "job": "prod-4"}) is None
    from tests.alerting.test_cost import costly

    LiveState(store.r, cfg.redis.key_prefix).apply(costly("straggler-xyz", lost=1.0))
    run("ack", "straggler-xyz", "--by", "alice")  # an incident Vigil knows (others refused)
    assert store.acked("straggler-xyz")


def test_cli_alerts_lists_the_costliest_first(isolated_env: dict[str, str]) -> None:
    import sys

    from tests.alerting.test_cost import costly

    cfg = load(env=isolated_env)
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    now = time.time()
    for ident, lost, age in (("cheap", 0.5, 10), ("dear", 12.0, 300), ("unknown", None, 5),
                             ("middle", 3.0, 60)):
        state.apply(dict(costly(ident, lost=lost), detected_at=now - age,
                         summary=f"incident {ident}"))
    out = subprocess.run([sys.executable, "-m", "vigil_gpu_monitor", "alerts"], env=isolated_env,
                         check=True, text=True, capture_output=True, timeout=60).stdout
    rows = [line for line in out.splitlines() if "incident " in line]
    assert [r.split("incident ")[1] for r in rows] == ["dear", "middle", "cheap", "unknown"]
    assert rows[0].split("incident ")[0].split()[-1] == "12"  # GPU-hours per hour
    assert rows[3].split("incident ")[0].split()[-1] == "–"  # no estimate


def test_a_costly_incident_pages_and_its_cost_is_counted(
        isolated_env: dict[str, str], alertmanager: str) -> None:
    from tests.alerting.test_cost import costly

    now = time.time()
    dear = dict(costly("dear-1", lost=9.0, job="job-d"), started_at=now - 3600,
                detected_at=now - 3590)
    cheap = dict(costly("cheap-1", lost=1.5, job="job-c"), started_at=now - 60,
                 detected_at=now - 50)
    dear_end = dict(dear, state="resolved", detected_at=now)  # as the worker sends it
    cfg = load(env=dict(isolated_env, VIGIL_ALERTER_ALERTMANAGER_URL=alertmanager,
                        VIGIL_ALERTER_PAGE_GPU_HOURS_PER_HOUR="8"))
    _publish(cfg, [dear, cheap])
    alerter = _alerter(cfg)
    try:
        _run(alerter, lambda: alerter.applied >= 2 and len(_am_alerts(alertmanager)) >= 2)
        severity = {a["labels"]["incident"]: a["labels"]["severity"]
                    for a in _am_alerts(alertmanager)}
        assert severity == {"dear-1": "critical", "cheap-1": "warning"}
        stored = {d["id"]: d for d in alerter.state.open_incidents()}
        assert stored["dear-1"]["severity"] == "critical"
        text = _scrape(alerter)
        assert 'vigil_gpu_hours_lost_total{job="job-d",kind="straggler"} 9.0' in text
        # 90 + 90 GPUs watched, 10.5 GPU-hours per hour lost now
        assert "vigil_gpu_hours_lost_per_hour 10.5" in text
        assert f"vigil_fleet_goodput {1 - 10.5 / 180}" in text
        _publish(cfg, [dear_end])
        _run(alerter, lambda: [a["labels"]["incident"] for a in _am_alerts(alertmanager)]
             == ["cheap-1"], timeout=15)
    finally:
        alerter.close()
        alerter.consumer.close()
    assert [a["labels"]["incident"] for a in _am_alerts(alertmanager)] == ["cheap-1"]
    assert alerter.ledger.losing_now() == {"job-c": 1.5}


def _scrape(alerter: Alerter) -> str:
    from prometheus_client import generate_latest

    from vigil_gpu_monitor.alerting.metrics import alerter_registry

    return generate_latest(alerter_registry(alerter)).decode()
