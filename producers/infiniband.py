"""InfiniBand / RoCE port counters from sysfs (``/sys/class/infiniband``; root injectable).

``port_xmit_data`` and ``port_rcv_data`` count 4-byte words (per the IB spec), so
bytes/s = Δwords × 4 / Δt. ``rate`` reads like ``"400 Gb/sec (4X NDR)"``. Errors are
``symbol_error + port_rcv_errors + link_downed`` (cumulative); ``port_xmit_wait``
(in ``counters/``, or ``hw_counters/`` on some drivers) becomes ticks/s. A counter
that goes backwards (reset, wrap) yields no rate for that tick rather than a lie.
"""

from __future__ import annotations

import re
from pathlib import Path

from vigil_gpu_monitor.producers.reading import Reading

WORD_BYTES = 4
ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "link_downed")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class InfinibandSource:
    """Every port of every HCA under ``root`` as NIC ``<device>`` (port 1) or
    ``<device>:<port>``."""

    def __init__(self, root: str | Path = "/sys/class/infiniband") -> None:
        self.root = Path(root)
        self._previous: dict[str, tuple[float, dict[str, int]]] = {}

    def ports(self) -> list[tuple[str, Path]]:
        """(NIC name, port directory) for every port found."""
        found = []
        for device in sorted(self.root.glob("*")):
            for port in sorted((device / "ports").glob("*")):
                name = device.name if port.name == "1" else f"{device.name}:{port.name}"
                found.append((name, port))
        return found

    def read(self, now: float) -> Reading:
        reading = Reading()
        for name, port in self.ports():
            counters = {c: _read_int(port / "counters" / c) for c in
                        ("port_xmit_data", "port_rcv_data", *ERROR_COUNTERS, "port_xmit_wait")}
            if counters["port_xmit_wait"] is None:
                counters["port_xmit_wait"] = _read_int(port / "hw_counters" / "port_xmit_wait")
            nic: dict[str, float] = {}
            rate = self._rate(port)
            if rate is not None:
                nic["ib_rate"] = rate
            errors = [counters[c] for c in ERROR_COUNTERS]
            if all(e is not None for e in errors):
                nic["ib_errors"] = float(sum(e for e in errors if e is not None))
            current = {k: v for k, v in counters.items() if v is not None}
            previous = self._previous.get(name)
            self._previous[name] = (now, current)
            if previous is not None and now > previous[0]:
                dt = now - previous[0]
                for metric, counter, scale in (("ib_tx", "port_xmit_data", WORD_BYTES),
                                               ("ib_rx", "port_rcv_data", WORD_BYTES),
                                               ("ib_xmit_wait", "port_xmit_wait", 1)):
                    a, b = previous[1].get(counter), current.get(counter)
                    if a is not None and b is not None and b >= a:
                        nic[metric] = (b - a) * scale / dt
            reading.nics[name] = nic
        return reading

    @staticmethod
    def _rate(port: Path) -> float | None:
        try:
            match = re.match(r"\s*([\d.]+)\s*Gb/sec", (port / "rate").read_text())
        except OSError:
            return None
        return float(match.group(1)) if match else None
