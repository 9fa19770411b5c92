"""The tour's fault schedule, replayed offline: every fault is found by Vigil, nothing
else fires, and the summary says what the static rules would have caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.vigil.evaluation.demo import (
    DURATION,
    HISTORY,
    SCHEDULE,
    demo_cluster,
    demo_simulator,
    static_rules,
    summary,
)

START = 1_860_000_000.0


def test_demo_schedule_is_detected_and_summarised() -> None:
    cluster = demo_cluster(START)
    assert len({n for job in cluster.jobs for n in job.nodes}) == 32
    assert {job.kind for job in cluster.jobs} == {"data_parallel", "pipeline", "moe"}
    runner = ReplayRunner(DetectConfig())
    found = [d for s in demo_simulator(cluster, START).samples(HISTORY + DURATION)
             for d in runner.feed(s)]
    static, truth = static_rules(cluster, START)
    table, missed = summary(cluster, START, found, static, truth)
    assert missed == 0, table
    assert f"{len(SCHEDULE)} of {len(SCHEDULE)} faults detected; 0 detection(s)" in table
    rows = [line for line in table.splitlines() if line.strip().endswith(("missed", "s"))
            and "fault" not in line and "s " in line[:6]]
    assert len(rows) == len(SCHEDULE), table
    # Today's static rules catch only the XID in this schedule.
    assert {r["rule"] for r in static} == {"xid"}
    assert sum(line.endswith("missed") for line in rows) == len(SCHEDULE) - 1, table
    # Each fault that slows its job shows Vigil's cost estimate beside the truth.
    costed = 0
    for line in rows:
        cells = line.split()
        at = next(i for i, c in enumerate(cells[1:], 1) if c[:-1].isdigit() and c[-1] == "s")
        if cells[1] != "xid" and "–" not in cells[at + 1:at + 3]:
            estimate, true = float(cells[at + 1]), float(cells[at + 2])
            assert abs(estimate - true) <= max(0.25 * true, 0.3), line
            costed += 1
    assert costed == len(SCHEDULE) - 1, table  # all but the XID


def test_the_closing_lines_run_after_the_demo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Every command the demo's closing lines give for its trace works with the stack
    stopped (here on a short trace of the same jobs, written the way the demo writes)."""
    import shlex

    from vigil_gpu_monitor.contracts.config import load
    from vigil_gpu_monitor.vigil import evaluation
    from vigil_gpu_monitor.vigil.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(evaluation.demo, "HISTORY", 0.0)
    monkeypatch.setattr(evaluation.demo, "DURATION", 30.0)
    (tmp_path / evaluation.demo.LOG_DIR).mkdir(parents=True)
    evaluation.demo.write_trace(demo_cluster(START), START, "r1")
    text = evaluation.demo.next_steps(evaluation.demo.trace_path("r1"), load(env={}), "r1",
                                      stack_stopped=True)
    offline = [shlex.split(line.split("#")[0])[1:] for line in text.splitlines()
               if "--trace" in line or line.strip().startswith("vigil replay")
               or "select-metrics" in line]
    assert len(offline) == 3
    for argv in offline:
        assert main(argv) == 0, argv
    assert "vigil down" in text and "vigil alerts" in text
    capsys.readouterr()
