"""The detectors on counters a real H100 made (tests/producers/fixtures/real_gpu_h100*).

One GPU was recorded, paced as one rank of a synchronous job, through phases of known
cause. Here it is GPU 0 of an 8-GPU node whose seven peers replay the same GPU's
healthy phases, each from its own offset: every reading the detectors see is a real
one (the real window-against-step beat, the real counter ratios), only the peers are
the same silicon. Each cause's samples are cycled to last as long as a test needs.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from tests.real_gpu import real_gpu_check
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Detection
from vigil_gpu_monitor.detectors.engine import ReplayRunner

FIXTURES = Path(__file__).resolve().parents[1] / "producers" / "fixtures"
HEALTHY = ("baseline", "settle", "memory-clock", "resumed")  # memory-clock: not applied
LEAD = 240  # seconds of the healthy job before the cause



def _phases(name: str, tmp: Path) -> dict[str, list[dict[str, Any]]]:
    fixture = FIXTURES / name
    trace = tmp / f"{name}.jsonl"
    trace.write_bytes(gzip.decompress((fixture / "trace.jsonl.gz").read_bytes()))
    phases = real_gpu_check().phase_samples(fixture / "events.log", trace)
    # the healthy pool: the phases where the paced loop ran unchanged (the first
    # seconds of the run, before the loop's calibration, are no phase)
    phases["healthy"] = [s for p in HEALTHY for s in phases.get(p, [])]
    return phases


def _replay(phases: dict[str, list[dict[str, Any]]], cause: str, seconds: int,
            processes: float | None = None) -> list[tuple[int, Detection]]:
    """(seconds since the cause began, detection) of an 8-GPU node: GPU 0 healthy for
    LEAD seconds, then ``cause`` for ``seconds``; peers healthy throughout.
    ``processes``: GPU 0's ``compute_processes`` during the cause (every GPU reads 1
    otherwise); None: no GPU reads it, as the fixtures were recorded."""
    healthy, own = phases["healthy"], phases[cause]
    assert len(healthy) >= 20 and len(own) >= 10
    runner = ReplayRunner(DetectConfig())
    found = []
    for k in range(LEAD + seconds):
        first = healthy[k % len(healthy)] if k < LEAD else own[(k - LEAD) % len(own)]
        gpus = {"0": dict(first["gpus"]["0"])}
        gpus.update({str(i): dict(healthy[(k + 11 * i) % len(healthy)]["gpus"]["0"])
                     for i in range(1, 8)})
        if processes is not None:
            for i, gpu in gpus.items():
                gpu["compute_processes"] = processes if i == "0" and k >= LEAD else 1.0
        sample = {**first, "ts": 1_800_000_000.0 + k, "job": "real", "node": "n1",
                  "gpus": gpus, "meta": {**first.get("meta", {}),
                                         "gpu_uuids": {str(i): f"GPU-{i}" for i in range(8)},
                                         # one GPU paced as a rank: it moved no
                                         # collective's bytes to measure synchrony by
                                         "job_sync": True}}
        found += [(k - LEAD, d) for d in runner.feed(sample)]  # type: ignore[arg-type]
    return found


def _firing(found: list[tuple[int, Detection]], kind: str) -> list[tuple[int, Detection]]:
    return [(t, d) for t, d in found if d["kind"] == kind and d["state"] == "firing"]


@pytest.fixture(scope="module")
def run1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return _phases("real_gpu_h100", tmp_path_factory.mktemp("run1"))


@pytest.fixture(scope="module")
def run3(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return _phases("real_gpu_h100_stall", tmp_path_factory.mktemp("run3"))


def test_a_healthy_real_gpu_among_its_peers_raises_nothing(
        run1: dict[str, list[dict[str, Any]]]) -> None:
    assert _replay(run1, "healthy", 900) == []


def test_a_throttled_real_gpu_is_a_straggler_with_its_clock_signature(
        run1: dict[str, list[dict[str, Any]]]) -> None:
    found = _firing(_replay(run1, "throttled", 120), "straggler")
    assert found and found[0][0] <= 30, found  # 20 % slower: found within 30 s
    assert found[0][1]["gpu"] == "0" and found[0][1]["evidence"]["clock_signature"]


def test_a_real_stall_with_no_bytes_moved_is_a_straggler(
        run3: dict[str, list[dict[str, Any]]]) -> None:
    found = _firing(_replay(run3, "stall", 120), "straggler")
    assert found and found[0][0] <= 30, found
    assert found[0][1]["gpu"] == "0" and not found[0][1]["evidence"]["clock_signature"]


def _load_only(found: list[tuple[int, Detection]]) -> dict[str, Any]:
    """The first load_imbalance's evidence, found within 90 s, with no straggler."""
    assert _firing(found, "straggler") == []
    imbalance = _firing(found, "load_imbalance")
    assert imbalance and imbalance[0][0] <= 90, found
    return imbalance[0][1]["evidence"]


def test_real_extra_work_is_load_imbalance_never_a_straggler(
        run1: dict[str, list[dict[str, Any]]]) -> None:
    evidence = _load_only(_replay(run1, "more-work", 300))
    assert evidence["share_above_peers"] == pytest.approx(0.20, abs=0.03)


def test_real_memory_bound_work_is_load_imbalance_in_bytes_never_a_straggler(
        run3: dict[str, list[dict[str, Any]]]) -> None:
    # more bytes moved (dram_active x1.35) with the tensor work level: work of a
    # memory-bound kind
    evidence = _load_only(_replay(run3, "memory-work", 300))
    assert evidence["share_basis"] == "dram_active"
    assert evidence["share_above_peers"] == pytest.approx(0.35, abs=0.05)


def test_a_second_process_on_a_real_gpu_is_a_straggler_where_processes_are_counted(
        run1: dict[str, list[dict[str, Any]]]) -> None:
    # the recorded competitor: another process's matrix products on GPU 0 (the job's
    # step took 1.8x as long). The fixture predates compute_processes, so the count
    # the agent now reads is set here: 2 on GPU 0 while the competitor ran
    found = _replay(run1, "competitor", 120, processes=2.0)
    stragglers = _firing(found, "straggler")
    assert stragglers and stragglers[0][0] <= 30, found
    evidence = stragglers[0][1]["evidence"]
    assert evidence["shared_gpu"] and not evidence["remediable"]
    assert _firing(found, "load_imbalance") == []
    # without a process count (an exporter that does not give it) it reads as more work
    blind = _replay(run1, "competitor", 120)
    assert _firing(blind, "straggler") == [] and _firing(blind, "load_imbalance")
