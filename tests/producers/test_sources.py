"""InfiniBand sysfs and host /proc sources against fake trees (dcgm-exporter: test_dcgm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil_gpu_monitor.producers.host import HostSource
from vigil_gpu_monitor.producers.infiniband import InfinibandSource


def _port(root: Path, dev: str, port: str, counters: dict[str, int], rate: str,
          hw: dict[str, int] | None = None) -> None:
    base = root / dev / "ports" / port
    (base / "counters").mkdir(parents=True, exist_ok=True)
    (base / "hw_counters").mkdir(parents=True, exist_ok=True)
    (base / "rate").write_text(rate + "\n")
    for name, value in counters.items():
        (base / "counters" / name).write_text(f"{value}\n")
    for name, value in (hw or {}).items():
        (base / "hw_counters" / name).write_text(f"{value}\n")


def test_infiniband_rates_from_word_counters(tmp_path: Path) -> None:
    base = {"port_xmit_data": 1000, "port_rcv_data": 2000, "symbol_error": 1,
            "port_rcv_errors": 2, "link_downed": 0}
    _port(tmp_path, "mlx5_0", "1", base, "400 Gb/sec (4X NDR)", {"port_xmit_wait": 50})
    _port(tmp_path, "mlx5_1", "2", {**base, "port_xmit_wait": 7}, "200 Gb/sec (4X HDR)")
    source = InfinibandSource(tmp_path)
    first = source.read(10.0)
    assert first.nics["mlx5_0"] == {"ib_rate": 400.0, "ib_errors": 3.0}
    assert first.nics["mlx5_1:2"]["ib_rate"] == 200.0
    _port(tmp_path, "mlx5_0", "1", {**base, "port_xmit_data": 1000 + 250_000_000,
                                    "port_rcv_data": 2000 + 500_000_000, "link_downed": 1},
          "400 Gb/sec (4X NDR)", {"port_xmit_wait": 1050})
    second = source.read(12.0).nics["mlx5_0"]
    assert second["ib_tx"] == pytest.approx(250_000_000 * 4 / 2)  # 4-byte words
    assert second["ib_rx"] == pytest.approx(500_000_000 * 4 / 2)
    assert second["ib_xmit_wait"] == pytest.approx(500)
    assert second["ib_errors"] == 4.0


def test_infiniband_counter_reset_gives_no_rate(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", "1", {"port_xmit_data": 10**9, "port_rcv_data": 10**9},
          "400 Gb/sec")
    source = InfinibandSource(tmp_path)
    source.read(1.0)
    _port(tmp_path, "mlx5_0", "1", {"port_xmit_data": 5, "port_rcv_data": 5}, "400 Gb/sec")
    nic = source.read(2.0).nics["mlx5_0"]
    assert "ib_tx" not in nic and "ib_rx" not in nic and "ib_errors" not in nic


def test_missing_sysfs_is_no_nics(tmp_path: Path) -> None:
    assert InfinibandSource(tmp_path / "absent").read(1.0).nics == {}


def test_host_cpu_and_memory(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:  1000 kB\nMemFree: 100 kB\n"
                                      "MemAvailable:  400 kB\n")
    (tmp_path / "stat").write_text("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3\n")
    source = HostSource(tmp_path)
    first = source.read(1.0)
    assert "cpu_util" not in first.host and first.host["mem_used"] == 600 * 1024
    (tmp_path / "stat").write_text("cpu  160 0 140 900 0 0 0 0 0 0\n")
    assert source.read(2.0).host["cpu_util"] == pytest.approx(100 / 200)
