"""Host CPU utilisation and memory from ``/proc`` (root injectable)."""

from __future__ import annotations

from pathlib import Path

from vigil_gpu_monitor.producers.reading import Reading


class HostSource:
    """``cpu_util`` from the aggregate line of /proc/stat, ``mem_used`` from /proc/meminfo
    (MemTotal − MemAvailable)."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self.root = Path(root)
        self._previous: tuple[int, int] | None = None

    def read(self, now: float) -> Reading:
        reading = Reading()
        cpu = self._cpu()
        if cpu is not None:
            reading.host["cpu_util"] = cpu
        memory = self._memory()
        if memory is not None:
            reading.host["mem_used"] = memory
        return reading

    def _cpu(self) -> float | None:
        try:
            fields = (self.root / "stat").read_text().splitlines()[0].split()
            values = [int(v) for v in fields[1:]]
        except (OSError, ValueError, IndexError):
            return None
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        total = sum(values[:8])  # guest time is already inside user/nice
        previous, self._previous = self._previous, (idle, total)
        if previous is None or total <= previous[1]:
            return None
        busy = 1.0 - (idle - previous[0]) / (total - previous[1])
        return min(1.0, max(0.0, busy))

    def _memory(self) -> float | None:
        info: dict[str, int] = {}
        try:
            for line in (self.root / "meminfo").read_text().splitlines():
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        except (OSError, ValueError, IndexError):
            return None
        if "MemTotal" not in info or "MemAvailable" not in info:
            return None
        return float(max(0, info["MemTotal"] - info["MemAvailable"]))
