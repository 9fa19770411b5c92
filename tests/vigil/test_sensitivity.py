"""The envelope's sensitivity table is produced: a row per parameter end, each summing
its scenarios (a tiny subset of bench/bench_envelope.py's run)."""

from __future__ import annotations

from vigil_gpu_monitor.vigil.evaluation.benchdetect import Tally
from vigil_gpu_monitor.vigil.evaluation.envelope import CLASSES
from vigil_gpu_monitor.vigil.evaluation.sensitivity import (
    by_step,
    by_step_lines,
    markdown,
    rows,
    scenarios,
    score,
    summarise,
)


def test_a_tiny_table_has_every_row_and_counts_its_scenarios() -> None:
    classes = tuple(c for c in CLASSES if c.name in ("healthy_data_parallel", "hang"))
    plan = rows(("nccl_channels",))
    assert plan == [("all", "drawn"), ("nccl_channels", "low"), ("nccl_channels", "high")]
    table = {}
    for row in plan[1:]:
        suite = scenarios(row, (201,), (4,), classes)
        assert {sc.cluster.jobs[0].envelope.nccl_channels  # type: ignore[union-attr]
                for sc in suite} == {2 if row[1] == "low" else 32}
        table[row] = summarise([score(sc) for sc in suite], classes)
    for s in table.values():
        assert s["scenarios"] == 2 and s["labels"] == 1 and s["hangs"] == 1
        assert 0 <= s["hangs_in_time"] <= s["found"] <= 1
        assert set(s["healthy_false"]) == {"straggler", "hang", "slowdown", "other"}
        assert s["refired"] == 0  # the hang pages once
    text = markdown(table)
    assert text.count("\n") == 3 and "| nccl_channels | low | 2 |" in text
    assert "| nccl_channels | high | 32 |" in text


def test_a_finding_that_fires_again_after_resolving_counts_as_a_page_more() -> None:
    """One fault, one page: the table counts every firing of the same kind, node and
    GPU beyond its first (a hang judged on empty bins at a 30 s tick fired 8-11 times)."""
    hang = next(c for c in CLASSES if c.name == "hang")
    [sc] = scenarios(("all", "drawn"), (201,), (4,), (hang,))
    start = sc.cluster.faults[0].start

    def det(state: str, at: float, node: str | None = None) -> dict[str, object]:
        return {"kind": "hang", "state": state, "node": node, "gpu": None, "job": sc.name,
                "detected_at": start + at, "summary": "", "started_at": start}

    tally = Tally()
    tally.score(sc, [det("firing", 10), det("resolved", 30), det("firing", 40),
                     det("resolved", 60), det("firing", 70), det("firing", 80, "node-001")])
    assert tally.refired == 2 and tally.found["hang"] == 1


def test_faults_are_counted_per_class_and_step_length() -> None:
    """The breakdown a row's one figure hides: each faulty class's faults found per
    job step length, healthy look-alikes left out."""
    def result(cls: str, step: float, found: int, healthy: bool = False) -> dict[str, object]:
        return {"class": cls, "step_seconds": step, "found": found,
                "labels": 0 if healthy else 1, "healthy": healthy}

    results = [result("host_bound", 10.0, 0), result("host_bound", 0.5, 1),
               result("host_bound", 10.0, 1), result("hang", 3.0, 1),
               result("healthy_moe", 1.4, 0, healthy=True)]
    assert by_step(results) == {"hang": {3.0: (1, 1)},  # type: ignore[arg-type]
                                "host_bound": {0.5: (1, 1), 10.0: (1, 2)}}
    lines = by_step_lines(("tick", "low"), results)  # type: ignore[arg-type]
    assert lines == ["  tick=low hang by step: 3 s 1/1",
                     "  tick=low host_bound by step: 0.5 s 1/1, 10 s 1/2"]


def test_a_scored_scenario_carries_its_job_step_length() -> None:
    hang = next(c for c in CLASSES if c.name == "hang")
    [sc] = scenarios(("all", "drawn"), (201,), (4,), (hang,))
    job = sc.cluster.jobs[0]
    assert score(sc)["step_seconds"] == round(job.compute_seconds + job.comm_seconds, 2)
