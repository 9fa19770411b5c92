"""`vigil replay --jobs N`: the jobs over processes, the detections and their order
exactly one process's, whatever the trace holds (node moves, bad lines, NaN)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil import replay_jobs
from vigil_gpu_monitor.vigil.cli import main


def _trace(tmp_path: Path) -> Path:
    """Three jobs of two nodes with a slow GPU each; a node of the first job moves to
    the last halfway, another leaves for no job, and the trace holds a blank line, a
    broken one, a sample refused by the contract and one repaired by it (a NaN
    reading dropped)."""
    specs = [JobSpec(f"job-{j}", [f"n{j}-{n}" for n in range(2)]) for j in range(3)]
    faults = [Fault("slow_gpu", spec.name, spec.nodes[1], "3", 1030.0 + 10 * j)
              for j, spec in enumerate(specs)]
    samples = list(Simulator(Cluster(specs, faults), 1000.0, seed=5).samples(150))
    moved, gone = specs[0].nodes[0], specs[1].nodes[0]
    for s in samples:
        if s["node"] == moved and s["ts"] >= 1075:
            s["job"] = specs[-1].name
        if s["node"] == gone and s["ts"] >= 1095:
            s["job"] = ""
    out = [encode_sample(s).decode() for s in samples]
    out[40] = re.sub(r'"power":[0-9.e+-]+', '"power":NaN', out[40], count=1)
    out[41] = json.dumps({**samples[41], "ts": -1})
    out.insert(100, "")
    out.insert(200, '{"schema": "vigil.sample/1", "broken"')
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(out) + "\n")
    return trace


def _replay(trace: Path, out: Path, *extra: str) -> str:
    assert main(["replay", str(trace), "--out", str(out), *extra]) == 0
    return out.read_text()


def _warnings(err: str) -> list[str]:
    return [line.split(": ", 1)[1] for line in err.splitlines()
            if re.search(r" WARNING vigil[.a-z]*: ", line)]


def test_processes_give_one_process_detections_in_its_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path)
    one = _replay(trace, tmp_path / "one.jsonl")
    warned = _warnings(capsys.readouterr().err)
    assert len({json.loads(d)["job"] for d in one.splitlines()}) == 3, "a detection a job"
    assert len(warned) == 1 and "invalid lines skipped" in warned[0]
    assert "first: line 42: " in warned[0] and "; line 201: " in warned[0]
    for n in ("2", "3", "5"):
        assert _replay(trace, tmp_path / f"{n}.jsonl", "--jobs", n) == one
        assert _warnings(capsys.readouterr().err) == warned


def test_plan_balances_jobs_and_finds_node_moves(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    plan = replay_jobs.make_plan(str(trace), 2)
    assert sorted(set(plan.process_of.values())) == [0, 1]
    moves = [m for part in plan.moves for m in part]
    assert len(moves) == 2 and {m.left for m in moves} <= set(plan.process_of)
    for p, part in enumerate(plan.moves):  # each move goes to the process of its old job
        assert all(plan.process_of[m.left] == p for m in part)
    assert list(plan.invalid) == [201]  # the broken line; the refused one is a process's


def test_a_line_decoded_otherwise_than_planned_falls_back_to_one_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = _trace(tmp_path)
    one = _replay(trace, tmp_path / "one.jsonl")
    make_plan = replay_jobs.make_plan

    def misread(path: str, processes: int, bin_seconds: float) -> replay_jobs.Plan:
        plan = make_plan(path, processes, bin_seconds)
        plan.jobs[0] = "not-" + plan.jobs[0]
        return plan

    monkeypatch.setattr(replay_jobs, "make_plan", misread)
    assert replay_jobs.replay_jobs(str(trace), 2, DetectConfig()) is None
    assert _replay(trace, tmp_path / "two.jsonl", "--jobs", "2") == one


def test_an_invalid_line_that_moved_a_node_in_the_plan_falls_back(tmp_path: Path) -> None:
    """A line the contract refuses, planned as a node's move to another job: the
    moves change without it, so the trace is replayed in one process."""
    trace = tmp_path / "t.jsonl"
    assert main(["simulate", "--out", str(trace), "--duration", "90", "--start", "1000",
                 "--jobs", "2", "--nodes", "2"]) == 0
    lines = trace.read_text().splitlines()
    samples = [json.loads(line) for line in lines]
    other = next(s["job"] for s in samples if s["job"] != samples[0]["job"])
    lines.insert(50, json.dumps({**samples[0], "job": other, "ts": -5}))
    trace.write_text("\n".join(lines) + "\n")
    assert replay_jobs.replay_jobs(str(trace), 2, DetectConfig()) is None
    assert _replay(trace, tmp_path / "two.jsonl", "--jobs", "2") == _replay(
        trace, tmp_path / "one.jsonl")


def test_a_bad_process_count_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "x.jsonl", "--jobs", "0"])
    assert exit_.value.code == 2
    assert "--jobs" in capsys.readouterr().err
