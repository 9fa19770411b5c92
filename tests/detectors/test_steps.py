"""Detection from per-rank step timings, and its merge with the counters' findings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import StepBatch
from vigil_gpu_monitor.detectors.engine import JobEngine
from vigil_gpu_monitor.detectors.findings import Finding
from vigil_gpu_monitor.detectors.step_merge import merge
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.simulator.steps import StepTimings
from vigil_gpu_monitor.vigil.evaluation.stepcheck import check

SEED = 3  # the bench's held-out seeds are 61-66


@pytest.mark.parametrize("case", ["slow_rank", "cpu_stall_rank", "cpu_stall_node",
                                  "stage_imbalance", "seq_noise", "cost_straggler"])
def test_timings_alone_find_what_the_issue_asks(case: str) -> None:
    result = check(case, SEED)
    assert result.passed, result.why


def test_a_fault_both_views_show_is_one_incident_that_says_they_agree() -> None:
    result = check("slow_rank", SEED, counters=True)
    assert result.passed, result.why
    straggler = [d for d in result.firing if d["kind"] == "straggler"]
    assert len(straggler) == 1
    assert straggler[0]["evidence"]["sources"] == ["counters", "timings"]
    assert straggler[0]["evidence"]["agree"] is True


def _finding(kind: str, node: str | None, gpu: str | None, **evidence: object) -> Finding:
    return Finding(kind, node, gpu, "warning", ("m",), 1.0, "s", 10.0, dict(evidence))


def _nothing(node: str, gpu: str | None) -> None:
    return None


def test_merge_keeps_the_counters_finding_with_the_measured_cost() -> None:
    counter = _finding("straggler", "n1", "3", job_slowdown=0.3, job_gpus=16,
                       cost_basis="baseline", remediable=True)
    timing = _finding("straggler", "n1", "3", job_slowdown=0.1, job_gpus=16,
                      cost_basis="steps", compute=1.1)
    out = merge([counter], [timing], _nothing, counters_speak=True)
    assert len(out) == 1
    ev = out[0].evidence
    assert (ev["agree"], ev["cost_basis"], ev["job_slowdown"], ev["remediable"]) == (
        True, "steps", 0.1, True)
    assert ev["timings"]["compute"] == 1.1


def test_a_straggler_only_timings_see_is_not_remediable() -> None:
    timing = _finding("straggler", "n1", "3", job_slowdown=0.1, cost_basis="steps")
    out = merge([], [timing], _nothing, counters_speak=True)
    assert out[0].evidence["remediable"] is False and out[0].evidence["agree"] is False
    alone = merge([], [timing], _nothing, counters_speak=False)
    assert alone[0].evidence["agree"] is None


def test_a_node_the_counters_blame_takes_its_gpus_timing_straggler() -> None:
    counter = _finding("straggler", "n1", None, host_bound=True, remediable=False)
    timing = _finding("straggler", "n1", "5", job_slowdown=0.2, cost_basis="steps")
    out = merge([counter], [timing], _nothing, counters_speak=True)
    assert [(f.node, f.gpu) for f in out] == [("n1", None)]
    assert out[0].evidence["agree"] is True and out[0].evidence["remediable"] is False


def test_a_slowdown_another_finding_explains_is_its_measured_cost() -> None:
    link = _finding("link_health", "n0", "1", job_slowdown=0.05, job_gpus=32,
                    cost_basis="baseline")
    slow = _finding("slowdown", None, None, job_slowdown=0.12, cost_basis="steps")
    out = merge([link], [slow], _nothing, counters_speak=True)
    assert [f.kind for f in out] == ["link_health"]
    assert out[0].evidence["job_slowdown"] == 0.12 and out[0].evidence["cost_basis"] == "steps"


def test_a_counter_straggler_the_timings_see_as_normal_says_they_disagree() -> None:
    counter = _finding("straggler", "n1", "3", job_slowdown=0.1, cost_basis="baseline")

    def look(node: str, gpu: str | None) -> dict[str, object]:
        return {"share_above_peers": 0.0, "slower": False, "evidence_ratio": 0.0,
                "job_slowdown": None}
    out = merge([counter], [], look, counters_speak=True)
    assert out[0].evidence["agree"] is False and out[0].evidence["sources"] == ["counters"]


def _batches(seconds: float) -> list[StepBatch]:
    t0 = 1_700_000_000.0
    cluster = Cluster([JobSpec("j", ["a", "b", "c"])],
                      [Fault("slow_gpu_quiet", "j", "b", "2", t0 + 60, severity=1.2)])
    sim = Simulator(cluster, t0, seed=SEED)
    timings = StepTimings(seed=SEED)
    sim.step_timings = timings
    out: list[StepBatch] = []
    for _ in sim.samples(seconds):
        out.extend(timings.drain())
    return out


def test_a_restored_engine_finds_what_an_uninterrupted_one_does() -> None:
    batches = _batches(150)
    whole, first, rest = JobEngine("j", DetectConfig()), JobEngine("j", DetectConfig()), []
    uninterrupted = []
    for batch in batches:
        whole.ingest_steps(batch)
        uninterrupted.extend(whole.advance())
    half = len(batches) // 2
    for batch in batches[:half]:
        first.ingest_steps(batch)
        rest.extend(first.advance())
    resumed = JobEngine("j", DetectConfig(), json.loads(json.dumps(first.to_state())))
    for batch in batches[half:]:
        resumed.ingest_steps(batch)
        rest.extend(resumed.advance())
    assert uninterrupted and rest == uninterrupted
    assert uninterrupted[0]["node"] == "b" and uninterrupted[0]["gpu"] == "2"


def test_steps_for_bins_already_evaluated_are_counted_late() -> None:
    batches = _batches(40)
    engine = JobEngine("j", DetectConfig())
    for batch in batches:
        engine.ingest_steps(batch)
        engine.advance()
    before = engine.late
    engine.ingest_steps(batches[0])
    assert engine.late == before + sum(len(r["steps"]) for r in batches[0]["ranks"])


def test_replay_reads_step_timings_beside_samples_or_alone(tmp_path: Path) -> None:
    """``vigil replay`` on a trace of step batches alone finds the slow rank."""
    from vigil_gpu_monitor.contracts.steps import encode_steps
    from vigil_gpu_monitor.vigil.cli import main

    trace, out = tmp_path / "steps.jsonl", tmp_path / "det.jsonl"
    lines = [encode_steps(b) for b in _batches(150)]
    trace.write_bytes(b"\n".join([*lines, b'{"schema": "vigil.step/1", "job": ""}']) + b"\n")
    assert main(["replay", str(trace), "--out", str(out)]) == 0
    found = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(d["kind"], d["node"], d["gpu"]) for d in found if d["state"] == "firing"] == [
        ("straggler", "b", "2")]
