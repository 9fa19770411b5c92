"""On-call channels: one ``send(detection)`` each; delivery policy lives elsewhere.

Every HTTP channel maps the answer the same way (``post_json``): 2xx is done;
429 and 5xx are worth retrying (honouring ``Retry-After``); any other 4xx is
permanent (the request itself is wrong, retrying cannot help); a network error or
timeout is worth retrying.
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any, Protocol

from vigil_gpu_monitor.alerting.cost import cost_text, with_cost
from vigil_gpu_monitor.contracts.config import Secret
from vigil_gpu_monitor.contracts.errors import VigilError
from vigil_gpu_monitor.contracts.messages import Detection


class DeliveryError(VigilError):
    """A send failed; ``permanent`` means do not retry; ``retry_after`` is the server's
    requested pause in seconds, if it gave one."""

    def __init__(self, message: str, permanent: bool = False,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


class Channel(Protocol):
    """Something that can deliver one detection (firing or resolved)."""

    name: str

    def send(self, det: Detection) -> None: ...


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (RFC 9110: delay-seconds, or an
    HTTP-date), never negative; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def post_json(url: str, body: Any, headers: dict[str, str] | None = None,
              timeout: float = 10.0) -> bytes:
    """POST JSON; raise ``DeliveryError`` classified as retryable or permanent."""
    data = json.dumps(body, separators=(",", ":")).encode() if not isinstance(body, bytes) \
        else body
    request = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "vigil-alerter", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        retry = exc.code == 429 or exc.code >= 500
        raise DeliveryError(f"HTTP {exc.code} from {_host(url)}", permanent=not retry,
                            retry_after=retry_after_seconds(
                                exc.headers.get("Retry-After"))) from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise DeliveryError(f"{_host(url)} unreachable: {exc}") from None


def _host(url: str) -> str:
    """The host part only: URLs of webhooks carry secrets in their path."""
    return url.split("/")[2] if "://" in url else "?"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def cost_annotations(det: Detection) -> dict[str, str]:
    """Alertmanager annotations of the cost (annotations, not labels: the estimate
    may change between firing and resolved, and labels are the alert's identity)."""
    text = cost_text(det)
    if not text:
        return {}
    ev = det["evidence"]
    return {"cost": text, "gpu_hours_lost_per_hour": str(ev.get("gpu_hours_lost_per_hour")),
            "job_slowdown": str(ev.get("job_slowdown"))}


def labels(det: Detection) -> dict[str, str]:
    """The labels routing, silences and Alertmanager match on."""
    out = {"alertname": "Vigil" + "".join(p.title() for p in det["kind"].split("_")),
           "kind": det["kind"], "severity": det["severity"], "job": det["job"],
           "incident": det["id"]}
    if det["node"] is not None:
        out["node"] = det["node"]
    if det["gpu"] is not None:
        out["gpu"] = det["gpu"]
    return out


class AlertmanagerChannel:
    """Prometheus Alertmanager ``POST /api/v2/alerts``; resolved carries ``endsAt``."""

    def __init__(self, url: str, name: str = "alertmanager", timeout: float = 10.0) -> None:
        self.name = name
        self.url = url.rstrip("/") + "/api/v2/alerts"
        self.timeout = timeout

    def send(self, det: Detection) -> None:
        alert: dict[str, Any] = {
            "labels": labels(det),
            "annotations": {"summary": with_cost(det["summary"], det),
                            "evidence": json.dumps(det["evidence"], sort_keys=True)[:4000],
                            **cost_annotations(det)},
            "startsAt": _iso(det["started_at"]),
        }
        if det["state"] == "resolved":
            alert["endsAt"] = _iso(min(det["detected_at"], time.time()))
        post_json(self.url, [alert], timeout=self.timeout)


class SlackChannel:
    """A Slack incoming webhook: one line per firing or resolved incident."""

    def __init__(self, webhook: Secret, name: str = "slack", timeout: float = 10.0) -> None:
        self.name = name
        self.webhook = webhook
        self.timeout = timeout

    def send(self, det: Detection) -> None:
        icon = ":white_check_mark:" if det["state"] == "resolved" else (
            ":rotating_light:" if det["severity"] == "critical" else ":warning:")
        text = (f"{icon} *{det['state'].upper()}* {det['kind']} in `{det['job']}`: "
                f"{with_cost(det['summary'], det)} (incident `{det['id']}`)")
        post_json(self.webhook.reveal(), {"text": text}, timeout=self.timeout)


class PagerDutyChannel:
    """PagerDuty Events API v2: trigger and resolve on one ``dedup_key`` (the incident id)."""

    def __init__(self, routing_key: Secret, url: str = "https://events.pagerduty.com/v2/enqueue",
                 name: str = "pagerduty", timeout: float = 10.0) -> None:
        self.name = name
        self.routing_key = routing_key
        self.url = url
        self.timeout = timeout

    def send(self, det: Detection) -> None:
        body: dict[str, Any] = {"routing_key": self.routing_key.reveal(),
                                "dedup_key": det["id"],
                                "event_action": "resolve" if det["state"] == "resolved"
                                else "trigger"}
        if det["state"] == "firing":
            body["payload"] = {
                "summary": with_cost(det["summary"], det)[:1024],
                "source": det["node"] or det["job"],
                "severity": {"info": "info", "warning": "warning"}.get(det["severity"],
                                                                      "critical"),
                "component": f"gpu {det['gpu']}" if det["gpu"] is not None else det["kind"],
                "group": det["job"], "class": det["kind"],
                "custom_details": det["evidence"],
            }
        post_json(self.url, body, timeout=self.timeout)


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """The webhook signature: HMAC-SHA256 over ``timestamp.body``, hex, ``sha256=`` prefix."""
    return "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body,
                                hashlib.sha256).hexdigest()


class WebhookChannel:
    """A generic JSON webhook; the receiver checks ``X-Vigil-Signature`` (and the
    timestamp it covers, against replays)."""

    def __init__(self, url: str, secret: Secret, name: str = "webhook",
                 timeout: float = 10.0) -> None:
        self.name = name
        self.url = url
        self.secret = secret
        self.timeout = timeout

    def send(self, det: Detection) -> None:
        body = json.dumps(det, separators=(",", ":"), sort_keys=True).encode()
        stamp = str(int(time.time()))
        post_json(self.url, body, timeout=self.timeout, headers={
            "X-Vigil-Timestamp": stamp,
            "X-Vigil-Signature": signature(self.secret.reveal().encode(), stamp, body)})


class KafkaAlertsChannel:
    """The ``vigil.alerts`` topic, for teams that consume alerts as data."""

    def __init__(self, producer: Any, topic: str, name: str = "kafka") -> None:
        self.name = name
        self.producer = producer
        self.topic = topic

    def send(self, det: Detection) -> None:
        try:
            self.producer.send(self.topic, key=det["job"].encode(),
                               value=json.dumps(det, separators=(",", ":")).encode()
                               ).get(timeout=10)
        except Exception as exc:  # kafka-python raises many types; all are retryable here
            raise DeliveryError(f"Kafka: {exc}") from None
