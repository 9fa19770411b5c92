"""Moneo's adaptive sampling (§2.3), per metric and device.

Every metric is *read* at the base interval; it is *published* at its own adaptive
interval. At the end of each sampling period the period's peak is compared with
the historical collected peak: if it moved by more than ``peak_change`` (10 %) of
it, or the readings are not dense around the peak (the share within
``density_band`` of it is below ``density_min``), the interval returns to the base
at once; otherwise it doubles (plus a small random jitter) up to ``max_interval``.
Between publishes, a reading that departs from the last published value by more
than ``peak_change`` of the peak is published immediately (a fault's onset is never
held back), and health signals (catalog ``health``: XID, ECC, link width and rate,
throttle reasons) are published the moment they change.

What is published for a period: the mean of its readings for ratios, rates and
gauges (the contract's "averaged over the sample interval"), the latest reading for
counters and states. The clock is injected; nothing here sleeps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from contracts.catalog import CATALOG, Kind, Metric, Scope

# A change smaller than this (per unit) is noise, whatever the peak.
NOISE_FLOOR = {"ratio": 0.01, "W": 5.0, "°C": 1.0, "MHz": 15.0, "bytes": float(1 << 20),
               "bytes/s": 1e6, "Gb/s": 1.0, "ticks/s": 100.0}
_BY_KEY = {(m.scope, m.name): m for m in CATALOG}


@dataclass(frozen=True)
class SamplingConfig:
    """Moneo's defaults: 10 % peak change, doubling up to a cap, with jitter."""

    base_interval: float = 1.0
    max_interval: float = 16.0
    peak_change: float = 0.10
    density_band: float = 0.10
    density_min: float = 0.8
    jitter: float = 0.1  # of the base interval, added when the interval grows


@dataclass
class _Series:
    interval: float
    due: float
    readings: list[float] = field(default_factory=list)
    peak: float | None = None  # historical collected peak
    last_published: float | None = None


class AdaptiveSampler:
    """Decides, reading by reading, what to publish."""

    def __init__(self, cfg: SamplingConfig, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self._rng = rng or random.Random(0)
        self._series: dict[tuple[Scope, str, str], _Series] = {}
        self.read = 0
        self.published = 0

    def offer(self, scope: Scope, device: str, name: str, value: float,
              now: float) -> float | None:
        """One reading at ``now``; returns the value to publish now, or None."""
        metric = _BY_KEY.get((scope, name))
        if metric is None:
            return None
        self.read += 1
        key = (scope, device, name)
        s = self._series.get(key)
        if s is None:
            s = self._series[key] = _Series(self.cfg.base_interval, now)
        s.readings.append(value)
        if metric.health or metric.kind in (Kind.STATE, Kind.COUNTER):
            return self._health(s, value, now)
        if s.last_published is not None and self._departs(metric, s, value):
            s.readings = [value]  # the held readings were stable: the step itself matters
            return self._publish(s, metric, now, reset=True)
        if now + 1e-9 >= s.due:
            return self._publish(s, metric, now, reset=self._unstable(metric, s))
        return None

    def _health(self, s: _Series, value: float, now: float) -> float | None:
        changed = s.last_published is None or value != s.last_published
        if changed or now + 1e-9 >= s.due:
            s.readings.clear()
            s.last_published = value
            s.interval = self.cfg.base_interval if changed else min(
                self.cfg.max_interval, s.interval * 2)
            s.due = now + s.interval
            self.published += 1
            return value
        return None

    def _scale(self, metric: Metric, s: _Series) -> float:
        peak = abs(s.peak) if s.peak is not None else 0.0
        return max(self.cfg.peak_change * peak, NOISE_FLOOR.get(metric.unit, 0.0))

    def _departs(self, metric: Metric, s: _Series, value: float) -> bool:
        assert s.last_published is not None
        return abs(value - s.last_published) > self._scale(metric, s)

    def _unstable(self, metric: Metric, s: _Series) -> bool:
        peak = max(s.readings)
        if s.peak is None or abs(peak - s.peak) > self._scale(metric, s):
            return True
        band = max(self.cfg.density_band * abs(peak), NOISE_FLOOR.get(metric.unit, 0.0))
        dense = sum(1 for r in s.readings if peak - r <= band) / len(s.readings)
        return dense < self.cfg.density_min

    def _publish(self, s: _Series, metric: Metric, now: float, reset: bool) -> float:
        value = sum(s.readings) / len(s.readings)
        if reset:
            s.interval = self.cfg.base_interval
            s.peak = max(s.readings)
        else:
            grown = s.interval * 2 + self._rng.uniform(0, self.cfg.jitter * self.cfg.base_interval)
            s.interval = min(self.cfg.max_interval, grown)
            s.peak = max(s.peak or 0.0, *s.readings)
        s.readings.clear()
        s.last_published = value
        s.due = now + s.interval
        self.published += 1
        return value

    def interval(self, scope: Scope, device: str, name: str) -> float | None:
        """The current publishing interval of one series (for meta and tests)."""
        s = self._series.get((scope, device, name))
        return s.interval if s else None
