"""Which channel hears about which detection, and when.

- **Routes** per channel: kinds, minimum severity, job patterns.
- **Silences** (matchers with expiry) and **acknowledgements** from ``SilenceStore``.
- **Pager channels** hear of a firing incident only once it has been firing for
  ``page_after_seconds``; one that resolves sooner pages nobody, and its resolve is
  not sent either. Other channels hear at once.
- **Resolves** go at once, and only to the channels that were told it was firing.
- **Flapping**: a condition that fired ``flap_max`` times within ``flap_window``
  stops notifying until it calms down (Redis still shows every state).
- **Re-sends** to channels that need them (Alertmanager expires alerts it does not
  hear about again) every ``resend_seconds`` while firing.
- **Never paged**: ``load_imbalance`` (severity info: uneven work the job's owner
  tunes, not a fault) goes only to channels that are not pagers, whatever a pager's
  route says; a job owner's channel is a webhook or the Kafka alerts topic with a
  route such as ``kinds=load_imbalance,slowdown``.
"""

from __future__ import annotations

import fnmatch
import time
from collections import deque
from dataclasses import dataclass, field

from vigil_gpu_monitor.alerting.channels import labels
from vigil_gpu_monitor.alerting.silences import SilenceStore
from vigil_gpu_monitor.contracts.codec import SEVERITIES
from vigil_gpu_monitor.contracts.messages import Detection

SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}
NEVER_PAGED = frozenset({"load_imbalance"})


@dataclass(frozen=True)
class Route:
    """A channel's filter. Parsed from ``"severity>=warning kinds=hang,gpu_health jobs=prod-*"``."""

    kinds: frozenset[str] = frozenset()
    min_severity: str = "info"
    jobs: tuple[str, ...] = ()
    pager: bool = False
    resend: bool = False

    @classmethod
    def parse(cls, text: str, pager: bool = False, resend: bool = False) -> Route:
        kinds: frozenset[str] = frozenset()
        severity, jobs = "info", tuple[str, ...]()
        for token in text.split():
            if token.startswith("severity>="):
                severity = token.removeprefix("severity>=")
            elif token.startswith("kinds="):
                kinds = frozenset(v for v in token.removeprefix("kinds=").split(",") if v)
            elif token.startswith("jobs="):
                jobs = tuple(v for v in token.removeprefix("jobs=").split(",") if v)
            else:
                raise ValueError(f"route: cannot read {token!r}")
        if severity not in SEVERITY_RANK:
            raise ValueError(f"route: unknown severity {severity!r}")
        return cls(kinds, severity, jobs, pager, resend)

    def accepts(self, det: Detection) -> bool:
        if self.pager and det["kind"] in NEVER_PAGED:
            return False
        return ((not self.kinds or det["kind"] in self.kinds)
                and SEVERITY_RANK[det["severity"]] >= SEVERITY_RANK[self.min_severity]
                and (not self.jobs or any(fnmatch.fnmatchcase(det["job"], j)
                                          for j in self.jobs)))


@dataclass
class _Open:
    det: Detection
    seen_at: float
    told: set[str] = field(default_factory=set)
    last_sent: float = 0.0


class Router:
    """Decides deliveries; returns (channel, detection) pairs to hand to the workers."""

    def __init__(self, routes: dict[str, Route], silences: SilenceStore,
                 page_after_seconds: float = 60.0, resend_seconds: float = 60.0,
                 flap_max: int = 3, flap_window: float = 1800.0) -> None:
        self.routes = routes
        self.silences = silences
        self.page_after = page_after_seconds
        self.resend = resend_seconds
        self.flap_max = flap_max
        self.flap_window = flap_window
        self.open: dict[str, _Open] = {}
        self.firings: dict[str, deque[float]] = {}
        self.suppressed: dict[str, str] = {}  # incident → why, for the delivery log

    def restore(self, det: Detection, told: set[str], now: float | None = None) -> None:
        """Re-open an incident after a restart (told = channels already notified)."""
        now = time.time() if now is None else now
        self.open[det["id"]] = _Open(det, det.get("detected_at", now), set(told), now)

    def _condition(self, det: Detection) -> str:
        return f"{det['job']}|{det['kind']}|{det['node']}|{det['gpu']}"

    def _flapping(self, det: Detection, now: float) -> bool:
        times = self.firings.setdefault(self._condition(det), deque())
        times.append(now)
        while times and times[0] < now - self.flap_window:
            times.popleft()
        return len(times) > self.flap_max

    def handle(self, det: Detection, now: float | None = None) -> list[tuple[str, Detection]]:
        """A new (non-duplicate) detection arrived."""
        now = time.time() if now is None else now
        if det["state"] == "resolved":
            entry = self.open.pop(det["id"], None)
            told = entry.told if entry else set()
            return [(name, det) for name in sorted(told)]
        if self._flapping(det, now):
            self.suppressed[det["id"]] = "flapping"
            return []
        silence = self.silences.silenced_by(labels(det), now)
        if silence:
            self.suppressed[det["id"]] = f"silenced by {silence}"
            return []
        entry = self.open[det["id"]] = _Open(det, now, last_sent=now)
        out = []
        for name, route in sorted(self.routes.items()):
            if route.accepts(det) and not route.pager:
                entry.told.add(name)
                out.append((name, det))
        return out

    def tick(self, now: float | None = None) -> list[tuple[str, Detection]]:
        """Pages that are now due, and re-sends of open incidents."""
        now = time.time() if now is None else now
        out = []
        for ident, entry in self.open.items():
            det = entry.det
            if self.silences.silenced_by(labels(det), now):
                continue
            acked = self.silences.acked(ident)
            for name, route in sorted(self.routes.items()):
                if not route.accepts(det):
                    continue
                if route.pager and name not in entry.told and not acked \
                        and now - entry.seen_at >= self.page_after:
                    entry.told.add(name)
                    out.append((name, det))
                elif route.resend and name in entry.told and now - entry.last_sent >= \
                        self.resend:
                    out.append((name, det))
            if any(r.resend for r in self.routes.values()) and now - entry.last_sent >= \
                    self.resend:
                entry.last_sent = now
        return out
