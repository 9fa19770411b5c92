"""InfiniBand sysfs, host /proc and dcgm-exporter sources against fake trees and fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.dcgm import DcgmExporterSource, parse
from producers.host import HostSource
from producers.infiniband import InfinibandSource


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


DCGM_TEXT = """\
# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in MHz).
# TYPE DCGM_FI_DEV_SM_CLOCK gauge
DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",device="nvidia0",modelName="H100",Hostname="n1"} 1980
DCGM_FI_DEV_SM_CLOCK{gpu="1",UUID="GPU-b",device="nvidia1",modelName="H100",hostname="n1"} 1410
# TYPE DCGM_FI_PROF_SM_ACTIVE gauge
DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a",device="nvidia0"} 0.612
DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-a"} 0.301
DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-a"} 0.25
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a"} 99
DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"} 1024
DCGM_FI_PROF_NVLINK_TX_BYTES{gpu="0",UUID="GPU-a"} 3.1e+10
DCGM_FI_PROF_PCIE_TX_BYTES{gpu="0",UUID="GPU-a"} 1200000000
DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-b",err_code="79",err_msg="GPU has fallen off the bus"} 79
DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b"} NaN
DCGM_FI_DEV_SOMETHING_ELSE{gpu="0"} 5
"""


def test_dcgm_exporter_text_maps_onto_the_catalog() -> None:
    reading = parse(DCGM_TEXT)
    assert reading.gpus["0"] == {
        "sm_clock": 1980.0, "sm_active": 0.612, "tensor_active": 0.301, "dram_active": 0.25,
        "gpu_util": 0.99, "mem_used": float(1 << 30), "nvlink_tx": 3.1e10, "pcie_tx": 1.2e9}
    assert reading.gpus["1"] == {"sm_clock": 1410.0, "xid": 79.0}  # NaN power: no reading


def test_dcgm_exporter_unreachable_is_counted() -> None:
    def refuse(url: str, timeout: float) -> str:
        raise ConnectionRefusedError("nobody home")

    source = DcgmExporterSource("http://127.0.0.1:1/metrics", fetch=refuse)
    assert source.read(1.0).gpus == {} and source.errors == 1
