"""What a source returns each tick, and the one-method interface every source has."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class Reading:
    """One tick's readings in contract units. Absent = no reading (never zero)."""

    gpus: dict[str, dict[str, float]] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    nics: dict[str, dict[str, float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def merge(self, other: Reading) -> Reading:
        """This reading with another's devices and metrics added (other wins on clashes)."""
        for gpu, metrics in other.gpus.items():
            self.gpus.setdefault(gpu, {}).update(metrics)
        self.host.update(other.host)
        for nic, metrics in other.nics.items():
            self.nics.setdefault(nic, {}).update(metrics)
        self.meta.update(other.meta)
        return self


class Source(Protocol):
    """A source of readings; ``now`` is monotonic seconds (rates need it)."""

    def read(self, now: float) -> Reading: ...
