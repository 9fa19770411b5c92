"""Moneo's adaptive sampling (§2.3), per metric and device.

Every metric is *read* at the base interval; it is *published* at its own adaptive
interval. At the end of each sampling period the period's peak is compared with
the historical collected peak: if it moved by more than ``peak_change`` (10 %) of
it, or the readings are not dense around the peak (the share within
``density_band`` of it is below ``density_min``), the interval returns to the base
at once; otherwise it doubles (plus a small random jitter) up to ``max_interval``.
Between publishes, a reading that departs from the last published value by more
than ``peak_change`` of the peak is published immediately (a fault's onset is never
held back) -- unless the series' own measurement noise explains the departure: a
departure must also exceed ``noise_sigmas`` times the noise, estimated robustly from
the median of the last ``NOISE_WINDOW`` reading-to-reading changes. This trigger is
ours, not Moneo's (Moneo waits for the period's end); without the noise test a noisy
series, such as PCIe traffic or a pipe that is nearly idle, would fire it on every
third reading and never back off. Moneo's own criteria (peak change, density) are
unchanged. A GPU's activity counters, clocks and cycle rates (``TOGETHER``) share one
schedule, so each published value of them covers the same span (ours too). Health
signals (catalog ``health``: XID, ECC, link width and rate,
throttle reasons) are published the moment they change, and a non-zero XID, which
is one event rather than a state, every time it is read.

What is published for a period: the mean of its readings for ratios, rates and
gauges (the contract's "averaged over the sample interval"), the latest reading for
counters and states. The clock is injected; nothing here sleeps.
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from vigil_gpu_monitor.contracts.catalog import CATALOG, Kind, Metric, Scope
from vigil_gpu_monitor.contracts.messages import Sample

# A GPU's activity counters, clocks and cycle rates describe one window together: a
# detector divides one by another (work per busy second, DESIGN.md principle 12), which
# means something only over the same span. They share one schedule (ours, not Moneo's).
TOGETHER = frozenset({"sm_active", "sm_occupancy", "tensor_active", "fp16_active",
                      "fp32_active", "fp64_active", "dram_active", "gpu_util",
                      "gr_engine_active", "sm_clock", "mem_clock", "sm_cycles_elapsed",
                      "sm_cycles_active", "mma_cycles_active"})
# A change smaller than this (per unit) is noise, whatever the peak.
NOISE_FLOOR = {"ratio": 0.01, "W": 5.0, "°C": 1.0, "MHz": 15.0, "bytes": float(1 << 20),
               "bytes/s": 1e6, "Gb/s": 1.0, "ticks/s": 100.0}
_BY_KEY = {(m.scope, m.name): m for m in CATALOG}
# How many reading-to-reading changes estimate a series' noise, and how many are needed
# before the estimate is used.
NOISE_WINDOW = 32
NOISE_MIN_CHANGES = 8
# median |x[t] - x[t-1]| of independent Gaussian readings = 0.6745 * sqrt(2) * sigma
_MEDIAN_CHANGE_PER_SIGMA = 0.6745 * 2 ** 0.5


@dataclass(frozen=True)
class SamplingConfig:
    """Moneo's defaults: 10 % peak change, doubling up to a cap, with jitter."""

    base_interval: float = 1.0
    max_interval: float = 16.0
    peak_change: float = 0.10
    density_band: float = 0.10
    density_min: float = 0.8
    jitter: float = 0.1  # of the base interval, added when the interval grows
    noise_sigmas: float = 2.5  # an immediate publish must exceed this many noise sigmas

    def __post_init__(self) -> None:
        """Refuse settings that would make the sampler meaningless, naming the field."""
        if not 0 < self.base_interval <= self.max_interval:
            raise ValueError(f"base_interval {self.base_interval} and max_interval "
                             f"{self.max_interval}: need 0 < base_interval <= max_interval")
        for name in ("peak_change", "density_band", "density_min"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} {getattr(self, name)}: must be in (0, 1]")
        if self.noise_sigmas < 0 or self.jitter < 0:
            raise ValueError("noise_sigmas and jitter cannot be negative")


@dataclass
class _Series:
    interval: float
    due: float
    readings: list[float] = field(default_factory=list)
    peak: float | None = None  # historical collected peak
    last_published: float | None = None
    previous: float | None = None  # the last reading, published or not
    changes: deque[float] = field(default_factory=lambda: deque(maxlen=NOISE_WINDOW))


class AdaptiveSampler:
    """Decides, reading by reading, what to publish."""

    def __init__(self, cfg: SamplingConfig, rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self._rng = rng or random.Random(0)
        self._series: dict[tuple[Scope, str, str], _Series] = {}
        self._groups: dict[tuple[Scope, str], _Series] = {}  # the schedule of TOGETHER
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
        if metric.health or metric.kind in (Kind.STATE, Kind.COUNTER):
            s.readings.append(value)
            return self._health(s, value, now, event=name == "xid" and value != 0)
        departs = s.last_published is not None and self._departs(metric, s, value)
        if s.previous is not None:
            s.changes.append(abs(value - s.previous))
        s.previous = value
        s.readings.append(value)
        if departs:
            s.readings = [value]  # the held readings were stable: the step itself matters
            return self._publish(s, metric, now, reset=True)
        if now + 1e-9 >= s.due:
            return self._publish(s, metric, now, reset=self._unstable(metric, s))
        return None

    def thin(self, sample: Sample, now: float) -> Sample:
        """A full-rate sample as the agent publishes it: every reading offered at
        ``now`` (the sampler's clock), only those to publish now kept. One sampler
        per node: series are keyed by device, not by node."""
        return {**sample,
                "gpus": {g: self._keep(Scope.GPU, g, m, now) for g, m in sample["gpus"].items()},
                "host": self._keep(Scope.HOST, "host", sample["host"], now),
                "nics": {n: self._keep(Scope.NIC, n, m, now) for n, m in sample["nics"].items()}}

    def _keep(self, scope: Scope, device: str, metrics: dict[str, float],
              now: float) -> dict[str, float]:
        kept = {}
        together = {n: v for n, v in metrics.items() if scope is Scope.GPU and n in TOGETHER}
        for name, value in metrics.items():
            if name in together:
                continue
            published = self.offer(scope, device, name, value, now)
            if published is not None:
                kept[name] = published
        if together:
            kept.update(self._offer_together(scope, device, together, now))
        return kept

    def _offer_together(self, scope: Scope, device: str, values: dict[str, float],
                        now: float) -> dict[str, float]:
        """Readings of ``TOGETHER`` on one schedule: when any of them departs, or the
        group is due, all are published, each the mean over the same span. Each is
        judged by its own criteria; the group backs off only while all are stable."""
        members = []
        departs = False
        for name, value in values.items():
            metric = _BY_KEY[(scope, name)]
            self.read += 1
            s = self._series.get((scope, device, name))
            if s is None:
                s = self._series[(scope, device, name)] = _Series(self.cfg.base_interval, now)
            departs |= s.last_published is not None and self._departs(metric, s, value)
            if s.previous is not None:
                s.changes.append(abs(value - s.previous))
            s.previous = value
            s.readings.append(value)
            members.append((name, metric, s, value))
        group = self._groups.get((scope, device))
        if group is None:
            group = self._groups[(scope, device)] = _Series(self.cfg.base_interval, now)
        if not departs and now + 1e-9 < group.due:
            return {}
        if departs:
            for _, _, s, value in members:
                s.readings = [value]  # the held readings were stable: the step matters
        reset = departs or any(self._unstable(m, s) for _, m, s, _ in members)
        out = {name: self._publish(s, metric, now, reset) for name, metric, s, _ in members}
        group.interval = members[0][2].interval  # one schedule: the first member's
        group.due = now + group.interval
        for _, _, s, _ in members:
            s.interval, s.due = group.interval, group.due
        return out

    def _health(self, s: _Series, value: float, now: float, event: bool) -> float | None:
        """A health state is published when it changes; an ``event`` (a non-zero XID:
        one new error, even with the code of the last one) whenever it is read."""
        changed = event or s.last_published is None or value != s.last_published
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
        step = abs(value - s.last_published)
        if step <= self._scale(metric, s):
            return False
        return step > self.cfg.noise_sigmas * self.noise(s)

    @staticmethod
    def noise(s: _Series) -> float:
        """The series' measurement noise (sigma), from its recent reading-to-reading
        changes; 0 until there are enough of them. The median keeps a real step or
        a burst of dips from inflating it."""
        if len(s.changes) < NOISE_MIN_CHANGES:
            return 0.0
        return statistics.median(s.changes) / _MEDIAN_CHANGE_PER_SIGMA

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

    def noise_of(self, scope: Scope, device: str, name: str) -> float | None:
        """The current noise estimate of one series (for tests and diagnosis)."""
        s = self._series.get((scope, device, name))
        return self.noise(s) if s else None
