"""What a detector returns: a ``Finding`` (one condition seen in one evaluation).

Detectors decide *what looks wrong now*; ``detectors.incidents`` decides *when that
is an incident* (persistence, hysteresis, stable ids). Keeping the two apart lets
every detector share one alerting policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    """A condition observed at one evaluation, with the numbers behind it."""

    kind: str
    node: str | None
    gpu: str | None
    severity: str
    metrics: tuple[str, ...]
    score: float
    summary: str
    since: float  # event time the condition began
    evidence: dict[str, Any] = field(default_factory=dict)
    fire_after: int | None = None  # evaluations before firing; None = the tracker's default
    # evaluations without it before a firing one resolves; None = the tracker's default
    # (a finding whose evidence comes once a step longer than a bin holds it longer)
    resolve_after: int | None = None

    @property
    def key(self) -> str:
        """Identity of the condition: the same key across evaluations is one incident."""
        return f"{self.kind}|{self.node or ''}|{self.gpu or ''}"


def fmt(value: float, unit: str = "") -> str:
    """A reading for a sentence: ratios as percent, big numbers with an SI prefix."""
    if unit == "ratio":
        return f"{value * 100:.0f}%"
    magnitude = abs(value)
    suffix = f" {unit}" if unit and unit not in ("count", "code", "bitmask") else ""
    for limit, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if magnitude >= limit:
            return f"{value / limit:.3g} {prefix}{unit or ''}".rstrip()
    if magnitude >= 100:
        return f"{value:.0f}{suffix}"
    return f"{value:.3g}{suffix}"
