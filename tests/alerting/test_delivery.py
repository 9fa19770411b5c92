"""Channels and delivery against a real local HTTP server (no Redis, no Kafka)."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import deque
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from tests.alerting.http_recorder import Recorder
from vigil_gpu_monitor.alerting.channels import (
    DeliveryError,
    PagerDutyChannel,
    SlackChannel,
    WebhookChannel,
    post_json,
    retry_after_seconds,
    signature,
)
from vigil_gpu_monitor.alerting.delivery import ChannelWorker, DeliveryPolicy
from vigil_gpu_monitor.alerting.router import Route
from vigil_gpu_monitor.contracts.config import Secret


def det(state: str = "firing", ident: str = "straggler-1", severity: str = "critical",
        kind: str = "straggler", job: str = "job-7") -> dict[str, Any]:
    return {"schema": "vigil.detection/1", "id": ident, "kind": kind, "state": state,
            "severity": severity, "job": job, "node": "n1", "gpu": "3", "started_at": 100.0,
            "detected_at": 130.0 if state == "firing" else 200.0, "metrics": ["sm_active"],
            "score": 9.0, "summary": "GPU 3 on n1 is out of step with its peers.",
            "evidence": {"z": 9}}


class Outcomes:
    def __init__(self) -> None:
        self.items: list[tuple[str, str, str, int, str]] = []
        self.done = threading.Event()

    def __call__(self, channel: str, d: dict[str, Any], result: str, attempts: int,
                why: str) -> None:
        self.items.append((channel, d["state"], result, attempts, why))
        if result != "retry":
            self.done.set()

    def final(self, timeout: float = 15.0) -> tuple[str, str, str, int, str]:
        assert self.done.wait(timeout), self.items
        return next(i for i in self.items if i[2] != "retry")


FAST = DeliveryPolicy(rate_per_second=50, max_attempts=4, backoff_seconds=0.05,
                      max_backoff_seconds=0.2, give_up_after_seconds=30)


@pytest.mark.parametrize(("script", "result", "attempts"), [
    ([], "delivered", 1),
    ([500, 500], "delivered", 3),
    ([429], "delivered", 2),
    (["hang"], "delivered", 2),
    ([400], "dead_letter", 1),  # the request is wrong: retrying cannot help
    ([500, 500, 500, 500], "dead_letter", 4),
])
def test_retry_policy(script: list[int | str], result: str, attempts: int) -> None:
    with Recorder(script=deque(script), retry_after="0.3", hang_seconds=1.5) as rec:
        outcomes = Outcomes()
        channel = SlackChannel(Secret(rec.url + "/hook"), timeout=0.5)
        worker = ChannelWorker(channel, FAST, outcomes)
        worker.submit(det())
        final = outcomes.final()
        worker.close()
    assert final[2:4] == (result, attempts), outcomes.items
    if script == [429]:
        gap = rec.requests[1].at - rec.requests[0].at
        assert gap >= 0.3, "Retry-After was not honoured"


def test_rate_limit_spaces_sends() -> None:
    with Recorder() as rec:
        outcomes = Outcomes()
        worker = ChannelWorker(SlackChannel(Secret(rec.url)),
                               DeliveryPolicy(rate_per_second=5), outcomes)
        for i in range(6):
            worker.submit(det(ident=f"s-{i}"))
        rec.wait_for(6)
        worker.close()
    times = [r.at for r in rec.requests]
    assert len(times) == 6 and times[-1] - times[0] >= 5 / 5 - 0.05


def test_a_dead_channel_does_not_hold_up_another() -> None:
    with Recorder(script=deque(["hang"] * 20), hang_seconds=2) as dead, Recorder() as alive:
        outcomes = Outcomes()
        slow = ChannelWorker(SlackChannel(Secret(dead.url), name="dead", timeout=0.5),
                             DeliveryPolicy(rate_per_second=50, backoff_seconds=1),
                             lambda *a: None)
        fast = ChannelWorker(SlackChannel(Secret(alive.url), name="alive"), FAST, outcomes)
        started = time.monotonic()
        for i in range(3):
            slow.submit(det(ident=f"x{i}"))
            fast.submit(det(ident=f"x{i}"))
        alive.wait_for(3, timeout=5)
        elapsed = time.monotonic() - started
        slow.close(timeout=1)
        fast.close()
    assert len(alive.requests) == 3 and elapsed < 2.0


def test_full_queue_dead_letters_instead_of_dropping() -> None:
    outcomes = Outcomes()
    with Recorder(script=deque(["hang"]), hang_seconds=1) as rec:
        worker = ChannelWorker(SlackChannel(Secret(rec.url), timeout=3),
                               DeliveryPolicy(queue_size=2), outcomes)
        for i in range(5):
            worker.submit(det(ident=f"q{i}"))
        worker.close(timeout=3)
    dead = [i for i in outcomes.items if i[2] == "dead_letter"]
    delivered = [i for i in outcomes.items if i[2] == "delivered"]
    assert len(dead) + len(delivered) == 5 and any("queue full" in i[4] for i in dead)


def test_pagerduty_triggers_and_resolves_on_one_dedup_key() -> None:
    with Recorder() as rec:
        channel = PagerDutyChannel(Secret("rk-123"), url=rec.url + "/v2/enqueue")
        channel.send(det("firing"))
        channel.send(det("resolved"))
    trigger, resolve = (r.json() for r in rec.requests)
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"] == "straggler-1"
    assert trigger["routing_key"] == "rk-123" and trigger["payload"]["severity"] == "critical"
    assert trigger["payload"]["source"] == "n1"


def test_webhook_is_signed() -> None:
    with Recorder() as rec:
        WebhookChannel(rec.url, Secret("s3cret")).send(det())
    req = rec.requests[0]
    stamp = req.headers["X-Vigil-Timestamp"]
    expected = "sha256=" + hmac.new(b"s3cret", stamp.encode() + b"." + req.body,
                                    hashlib.sha256).hexdigest()
    assert req.headers["X-Vigil-Signature"] == expected == signature(b"s3cret", stamp, req.body)
    assert req.json()["id"] == "straggler-1"


def test_errors_never_echo_the_secret_url() -> None:
    with pytest.raises(DeliveryError) as err:
        post_json("http://127.0.0.1:9/services/T000/B000/SECRETTOKEN", {}, timeout=0.5)
    assert "SECRETTOKEN" not in str(err.value)


def test_route_parsing_and_matching() -> None:
    route = Route.parse("severity>=warning kinds=hang,gpu_health jobs=prod-*")
    assert route.accepts(det(kind="hang", severity="critical", job="prod-1"))
    assert not route.accepts(det(kind="hang", severity="info", job="prod-1"))
    assert not route.accepts(det(kind="straggler", job="prod-1"))
    assert not route.accepts(det(kind="hang", job="dev-1"))
    assert Route.parse("").accepts(det(severity="info"))
    with pytest.raises(ValueError):
        Route.parse("severity>=loud")


@pytest.mark.parametrize(("header", "seconds"), [
    ("120", 120.0), ("0", 0.0), ("-5", 0.0),
    ("Sun, 22 Nov 2026 10:00:30 GMT", 30.0),  # RFC 9110 HTTP-date, 30 s ahead
    ("Sun, 22 Nov 2026 09:59:00 GMT", 0.0),  # already past
    ("soon", None), (None, None)])
def test_retry_after_in_seconds_or_http_date(header: str | None, seconds: float | None) -> None:
    now = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC).timestamp()
    assert retry_after_seconds(header, now=now) == seconds


def test_retry_after_as_an_http_date_is_honoured() -> None:
    ahead = format_datetime(datetime.now(UTC) + timedelta(seconds=2), usegmt=True)
    with Recorder(script=deque([429]), retry_after=ahead) as rec:
        outcomes = Outcomes()
        worker = ChannelWorker(SlackChannel(Secret(rec.url + "/hook"), timeout=0.5), FAST,
                               outcomes)
        worker.submit(det())
        final = outcomes.final()
        worker.close()
    assert final[2:4] == ("delivered", 2)
    assert rec.requests[1].at - rec.requests[0].at >= 0.9  # whole seconds: ≥ 1 s minus rounding
