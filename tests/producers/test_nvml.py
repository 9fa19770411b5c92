"""The NVML source against the fake, and the fake against the real nvidia-ml-py."""

from __future__ import annotations

import pynvml
import pytest

from vigil_gpu_monitor.contracts.catalog import GPU_METRICS
from vigil_gpu_monitor.producers.nvml import NVML_NAMES, NvmlSource
from vigil_gpu_monitor.producers.nvml_fake import FakeNvml, busy_training


def test_every_nvml_name_the_source_uses_exists_in_nvidia_ml_py() -> None:
    missing = [name for name in NVML_NAMES if not hasattr(pynvml, name)]
    assert missing == []


def test_the_fake_offers_every_function_the_source_calls() -> None:
    fake = FakeNvml()
    functions = [n for n in NVML_NAMES if n.startswith("nvml") and callable(getattr(pynvml, n))]
    assert all(name in type(fake).__dict__ for name in functions), [
        n for n in functions if n not in type(fake).__dict__]


def test_hopper_reading_has_every_catalog_metric_in_contract_units() -> None:
    source = NvmlSource(FakeNvml(gpus=8, clock=lambda: 5.0))
    reading = source.read(1.0)
    assert sorted(reading.gpus, key=int) == ["0", "2", "4", "6", "11", "13", "15", "17"]
    gpu = reading.gpus["0"]
    # all but graphics-engine activity, which costs a real H100 1.45 ms a read and which
    # gpu_util says already (producers/nvml.py)
    assert set(gpu) == set(GPU_METRICS) - {"gr_engine_active"}
    expected = busy_training(0, 5.0)
    assert gpu["power"] == pytest.approx(expected["power"], abs=0.001)  # mW → W
    assert gpu["gpu_util"] == pytest.approx(0.99)  # percent → ratio
    assert gpu["nvlink_tx"] == pytest.approx(30e9)  # MiB/s → bytes/s
    assert 0 <= gpu["sm_active"] <= 1 and gpu["xid"] == 0
    assert source.errors == {}
    assert reading.meta["gpu_uuids"]["11"].startswith("GPU-")


def test_pre_hopper_nvlink_rate_from_counters_and_pcie_in_bytes() -> None:
    clock = {"t": 100.0}
    fake = FakeNvml(gpus=2, hopper=False, clock=lambda: clock["t"])
    source = NvmlSource(fake)
    first = source.read(100.0).gpus["0"]
    assert "nvlink_tx" not in first  # a rate needs two counter readings
    clock["t"] = 101.0
    second = source.read(101.0).gpus["0"]
    assert second["nvlink_tx"] == pytest.approx(30e9, rel=0.01)
    assert second["pcie_tx"] == pytest.approx(1.2e9, rel=0.01)  # KB/s → bytes/s
    assert "sm_active" not in second  # no GPM before Hopper: absent, never zero


def test_a_driver_without_gpm_cycle_counters_still_gives_the_other_gpm_metrics() -> None:
    fake = FakeNvml(gpus=1)
    fake.gpm_max_metric = pynvml.NVML_GPM_METRIC_SM_CYCLES_ELAPSED - 1  # an older driver
    source = NvmlSource(fake)
    for tick in (1.0, 2.0):
        gpu = source.read(tick).gpus["0"]
        assert "sm_active" in gpu and "tensor_active" in gpu
        assert "sm_cycles_elapsed" not in gpu and "mma_cycles_active" not in gpu
    assert source.errors["NVMLError_InvalidArgument"] == 1  # refused once, not every tick


def test_unsupported_calls_are_absent_and_counted_never_raised() -> None:
    fake = FakeNvml(gpus=1)
    fake.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors"}
    source = NvmlSource(fake)
    gpu = source.read(1.0).gpus["0"]
    assert "power" not in gpu and "ecc_dbe" not in gpu and "sm_clock" in gpu
    assert source.errors["NVMLError_NotSupported"] == 3


def test_a_lost_gpu_is_absent_and_xid_reaches_the_right_gpu() -> None:
    fake = FakeNvml(gpus=4)
    source = NvmlSource(fake)
    fake.inject_xid(1, 79)  # index 1 has minor number 11
    reading = source.read(1.0)
    assert reading.gpus["11"]["xid"] == 79.0 and reading.gpus["0"]["xid"] == 0.0
    assert source.read(2.0).gpus["11"]["xid"] == 0.0  # an event is reported once
    fake.lose_gpu(1)
    assert "11" not in source.read(3.0).gpus and source.errors["NVMLError_GpuIsLost"] > 0
    source.close()


def test_several_xids_in_one_tick_are_published_one_a_tick_none_overwritten() -> None:
    fake = FakeNvml(gpus=2)
    source = NvmlSource(fake)
    for code in (31, 31, 48):
        fake.inject_xid(0, code)
    published = [source.read(float(t)).gpus["0"]["xid"] for t in range(1, 6)]
    assert published == [31.0, 31.0, 48.0, 0.0, 0.0]


def test_power_is_the_energy_counters_mean_over_the_tick_and_remaps_are_read() -> None:
    clock = {"t": 10.0}
    watts = {"t": 400.0}

    def profile(index: int, t: float) -> dict[str, float]:
        return {**busy_training(index, t), "power": watts["t"], "row_remap_pending": 1.0,
                "remapped_rows_uncorrectable": 2.0, "pcie_replay": 7.0}

    fake = FakeNvml(gpus=1, profile=profile, clock=lambda: clock["t"])
    source = NvmlSource(fake, interval=2.0)  # a tick longer than the gauge's second
    first = source.read(10.0).gpus["0"]
    assert first["power"] == pytest.approx(400.0)  # first tick: the gauge
    assert first["pcie_replay"] == 7.0  # the link is read at the first tick, then every 5 s
    clock["t"], watts["t"] = 12.0, 600.0  # the fake integrates 600 W over the 2 s
    fake._profile_cache.clear()
    second = source.read(12.0).gpus["0"]
    assert second["power"] == pytest.approx(600.0, rel=1e-3)  # ΔmJ / Δt, not the gauge
    assert second["row_remap_pending"] == 1.0 and second["row_remap_failure"] == 0.0
    assert second["remapped_rows_uncorrectable"] == 2.0
    assert second["nvlink_total"] == pytest.approx(second["nvlink_tx"] + second["nvlink_rx"])
    fake.unsupported = {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetTotalEnergyConsumption"}
    clock["t"] = 13.0
    third = source.read(13.0).gpus["0"]
    assert "row_remap_pending" not in third and third["power"] == pytest.approx(600.0)


@pytest.mark.parametrize(("hopper", "interval", "counter_read"), [
    (True, 1.0, False),  # Hopper's gauge is a 1 s mean: the dear counter adds nothing
    (True, 5.0, True),  # a tick longer than the gauge's second: the counter's mean
    (False, 1.0, True),  # an A100 (GA100): its gauge is one instant
])
def test_the_energy_counter_is_read_only_where_the_gauge_is_not_the_ticks_mean(
        hopper: bool, interval: float, counter_read: bool) -> None:
    fake = FakeNvml(gpus=2, hopper=hopper)
    fake.unsupported = {"nvmlDeviceGetTotalEnergyConsumption"}  # counts each call
    source = NvmlSource(fake, interval=interval)
    for tick in (1.0, 2.0):
        assert all("power" in gpu for gpu in source.read(tick).gpus.values())
    assert source.errors["NVMLError_NotSupported"] == (4 if counter_read else 0)


def test_compute_processes_counts_every_context_on_the_gpu() -> None:
    fake = FakeNvml(gpus=2)
    fake.processes = {1: 2}  # a leftover process beside the job's on the second GPU
    gpus = NvmlSource(fake).read(1.0).gpus
    assert gpus["0"]["compute_processes"] == 1.0 and gpus["11"]["compute_processes"] == 2.0
    fake.unsupported = {"nvmlDeviceGetComputeRunningProcesses"}
    source = NvmlSource(fake)
    assert "compute_processes" not in source.read(2.0).gpus["0"]  # absent, never 0


def test_the_pcie_link_is_read_every_link_interval_not_every_tick() -> None:
    """Its replay counter is the dearest call left on a real H100 (producers/nvml.py);
    the link changes only with a fault, and the detectors hold a skipped reading."""
    source = NvmlSource(FakeNvml(gpus=2), link_interval=5.0)
    link = {"pcie_gen", "pcie_width", "pcie_replay"}
    read = [t for t in range(12) if link <= set(source.read(float(t)).gpus["0"])]
    assert read == [0, 5, 10]
    assert all(not link & set(gpu) for gpu in source.read(12.0).gpus.values())
