"""A trace recorded on a real H100 (fixtures/real_gpu_h100, see its README): the agent's
readings against nvidia-smi's, issue #28's work-against-busy table on real counters,
and the detectors' replay of it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.real_gpu import real_gpu_check
from vigil_gpu_monitor.contracts.codec import decode_trace
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner

FIXTURE = Path(__file__).parent / "fixtures" / "real_gpu_h100"
STALL = Path(__file__).parent / "fixtures" / "real_gpu_h100_stall"



def unpacked(fixture: Path, tmp: Path) -> Path:
    path = tmp / f"{fixture.name}.jsonl"
    path.write_bytes(gzip.decompress((fixture / "trace.jsonl.gz").read_bytes()))
    return path


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpacked(FIXTURE, tmp_path_factory.mktemp("real"))


def test_work_rate_tells_throttle_stall_and_more_work_apart_on_a_real_gpu(trace: Path) -> None:
    checker = real_gpu_check()
    table = checker.phase_table(FIXTURE / "events.log", trace, FIXTURE / "train.log")
    found = checker.verdicts(table)
    # issue #28's table: a throttle raises busy time and tensor_active, not the work
    # rate; more work raises both together
    assert found["throttled"][1] == "yes" and found["more-work"][1] == "yes"
    assert found["memory-clock"][1].startswith("not applied")  # the H100 refused -lmc
    throttled, more = found["throttled"][0], found["more-work"][0]
    assert throttled["tensor"] == pytest.approx(1980 / 1410, rel=0.03)  # share of cycles
    assert more["work"] == pytest.approx(1.2, abs=0.03)  # the batch grew 20 %
    # the ground truth: the step's own work took longer in each
    for cause in ("throttled", "more-work"):
        assert table[cause]["step_ms"] > 1.1 * table["baseline"]["step_ms"]
    # this run's "stall" was memory-bound copies (see the README): work level, bytes up
    assert found["stall"][0]["work"] == pytest.approx(1.0, abs=0.02)
    assert found["stall"][0]["dram"] > 1.25


def test_a_stall_moves_no_bytes_and_memory_work_does(tmp_path: Path) -> None:
    checker = real_gpu_check()
    table = checker.phase_table(STALL / "events.log", unpacked(STALL, tmp_path),
                                STALL / "train.log")
    found = checker.verdicts(table)
    assert found["stall"][1] == "yes" and found["memory-work"][1] == "yes"
    stall, memory = found["stall"][0], found["memory-work"][0]
    assert stall["busy"] > 1.15 and stall["work"] == pytest.approx(1.0, abs=0.02)
    assert stall["dram"] == pytest.approx(1.0, abs=0.02) and memory["dram"] > 1.25


def test_real_readings_match_nvidia_smi(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real_gpu_check().compare(trace, FIXTURE / "smi.csv", FIXTURE / "dmon.txt")
    report = capsys.readouterr().out
    query_gpu = report.split("### against nvidia-smi --query-gpu")[1].split("###")[0]
    rows = {line.split("|")[1].strip(): line for line in query_gpu.splitlines()
            if line.startswith("| ") and "metric" not in line}
    for metric in ("power", "sm_clock", "mem_clock", "temperature", "gpu_util", "pcie_gen",
                   "throttle"):
        assert rows[metric].rstrip().endswith("| ok |"), rows[metric]


def test_the_detectors_raise_nothing_on_a_healthy_real_gpu(trace: Path) -> None:
    runner = ReplayRunner(DetectConfig())
    detections = [d for sample in decode_trace(trace.read_text().splitlines())
                  for d in runner.feed(sample)]
    assert len(runner.engines) == 1
    assert detections == []  # locked clocks and a power cap are settings, not faults
