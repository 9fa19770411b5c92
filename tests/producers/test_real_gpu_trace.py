"""A trace recorded on a real H100 (fixtures/real_gpu_h100, see its README): the agent's
readings against nvidia-smi's, issue #28's work-against-busy table on real counters,
and the detectors' replay of it."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from contracts.codec import decode_trace
from contracts.config import DetectConfig
from detectors.engine import ReplayRunner

FIXTURE = Path(__file__).parent / "fixtures" / "real_gpu_h100"
BENCH = Path(__file__).resolve().parents[2] / "bench" / "real_gpu_check.py"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("real_gpu_check", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("real") / "trace.jsonl"
    path.write_bytes(gzip.decompress((FIXTURE / "trace.jsonl.gz").read_bytes()))
    return path


def test_work_rate_tells_throttle_stall_and_more_work_apart_on_a_real_gpu(trace: Path) -> None:
    checker = _checker()
    table = checker.phase_table(FIXTURE / "events.log", trace, FIXTURE / "train.log")
    found = checker.verdicts(table)
    # issue #28's table: a throttle raises busy time and tensor_active, not the work
    # rate; a stall raises busy time alone; more work raises both together
    assert found["throttled"][1] == "yes" and found["stall"][1] == "yes"
    assert found["more-work"][1] == "yes"
    assert found["memory-clock"][1].startswith("not applied")  # the H100 refused -lmc
    throttled, stall, more = (found[k][0] for k in ("throttled", "stall", "more-work"))
    assert throttled["tensor"] == pytest.approx(1980 / 1410, rel=0.03)  # share of cycles
    assert stall["work"] == pytest.approx(1.0, abs=0.02)
    assert more["work"] == pytest.approx(1.2, abs=0.03)  # the batch grew 20 %
    # the ground truth: the step's own work took longer in each
    assert table["stall"]["step_ms"] > 1.1 * table["baseline"]["step_ms"]


def test_real_readings_match_nvidia_smi(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _checker().compare(trace, FIXTURE / "smi.csv", FIXTURE / "dmon.txt")
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
