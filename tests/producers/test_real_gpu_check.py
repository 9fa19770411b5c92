"""bench/real_gpu_check.py, the cross-check `bench/real_gpu.sh` runs on a GPU machine,
tried here on the fake NVML with nvidia-smi output written in its real formats."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.real_gpu import real_gpu_check
from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.producers.agent import Agent
from vigil_gpu_monitor.producers.attribution import StaticJob
from vigil_gpu_monitor.producers.nvml import NvmlSource
from vigil_gpu_monitor.producers.nvml_fake import FakeNvml

T0 = 1_790_000_000.0



def _write_run(tmp: Path, power_scale: float) -> tuple[Path, Path, Path]:
    """A 20 s agent trace of the fake GPU, and what nvidia-smi would have printed
    (power multiplied by ``power_scale`` to plant a unit error)."""
    clock = [0.0]
    lines: list[bytes] = []

    class Sink:
        def publish(self, sample: dict[str, object]) -> None:
            lines.append(encode_sample(sample))

    # the fake GPU on the same clock as the agent: its energy counter then grows by
    # the power over each 1 s tick, not over the real microseconds between ticks
    nvml = FakeNvml(gpus=2, clock=lambda: clock[0])
    agent = Agent("n1", {"nvml": NvmlSource(nvml)}, Sink(), None, StaticJob("j"),
                  wall=lambda: T0 + clock[0], monotonic=lambda: clock[0])
    smi = ["timestamp, uuid, power.draw [W], clocks.sm [MHz], clocks.mem [MHz], "
           "temperature.gpu, utilization.gpu [%], memory.used [MiB], pcie.link.gen.current, "
           "pcie.link.width.current, clocks_event_reasons.active"]
    dmon = ["#Date       Time        gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    "
            "jpg    ofa   mclk   pclk  rxpci  txpci",
            "#YYYYMMDD   HH:MM:SS    Idx      W      C      C      %      %      %      %      "
            "%      %    MHz    MHz   MB/s   MB/s"]
    link: dict[str, dict[str, float]] = {}
    for t in range(20):
        clock[0] = float(t)
        sample = agent.tick()
        when = datetime.fromtimestamp(T0 + t)
        for minor, m in sample["gpus"].items():
            uuid = sample["meta"]["gpu_uuids"][minor]
            # the agent reads the PCIe link every 5 s, nvidia-smi every row
            m = link[minor] = {**link.get(minor, {}), **m}
            smi.append(f"{when:%Y/%m/%d %H:%M:%S}.{int((T0 + t) % 1 * 1000):03d}, {uuid}, "
                       f"{m['power'] * power_scale:.2f}, {m['sm_clock']:.0f}, "
                       f"{m['mem_clock']:.0f}, {m['temperature']:.0f}, "
                       f"{m['gpu_util'] * 100:.0f}, {m['mem_used'] / (1 << 20):.0f}, "
                       f"{m['pcie_gen']:.0f}, {m['pcie_width']:.0f}, "
                       f"0x{int(m['throttle']):016X}")
            dmon.append(f" {when:%Y%m%d %H:%M:%S}    {minor}    {m['power']:.0f}     50     "
                        f"45     90     40      0      0      0      0   "
                        f"{m['mem_clock']:.0f}   {m['sm_clock']:.0f}  "
                        f"{m.get('pcie_rx', 0) / 1e6:.0f}  {m.get('pcie_tx', 0) / 1e6:.0f}")
    trace, smi_csv, dmon_txt = tmp / "trace.jsonl", tmp / "smi.csv", tmp / "dmon.txt"
    trace.write_bytes(b"\n".join(lines) + b"\n")
    smi_csv.write_text("\n".join(smi) + "\n")
    dmon_txt.write_text("\n".join(dmon) + "\n")
    return trace, smi_csv, dmon_txt


def _rows(report: str, table: str = "query-gpu") -> dict[str, str]:
    """metric → its row in the table whose title contains ``table``."""
    section = next(part for part in report.split("\n### ") if table in part.split("\n")[0])
    return {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| metric")}


def test_matching_units_read_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_gpu_check().compare(*_write_run(tmp_path, power_scale=1.0))
    rows = _rows(capsys.readouterr().out)
    for metric in ("power", "sm_clock", "mem_clock", "gpu_util", "mem_used", "pcie_gen",
                   "throttle"):
        assert metric in rows and rows[metric].rstrip().endswith("| ok |"), rows.get(metric)


def test_a_scale_error_is_flagged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_gpu_check().compare(*_write_run(tmp_path, power_scale=1000.0))  # as if NVML's mW leaked
    report = capsys.readouterr().out
    rows = _rows(report)
    assert "CHECK" in rows["power"] and "ok" in rows["sm_clock"]
    assert "ok" in _rows(report, "dmon")["power"]  # dmon's power was written right


def test_nvml_call_timing_runs_on_any_nvml(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import sys
    checker = real_gpu_check()
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus=2, call_cost=0.0))
    monkeypatch.setattr(time, "sleep", lambda s: None)
    checker.calls(ticks=5, interval=0.0)
    out = capsys.readouterr().out
    assert "| nvmlDeviceGetPowerUsage | 2.0 |" in out and "tick: wall median" in out
