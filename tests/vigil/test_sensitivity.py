"""The envelope's sensitivity table is produced: a row per parameter end, each summing
its scenarios (a tiny subset of bench/bench_envelope.py's run)."""

from __future__ import annotations

from vigil_gpu_monitor.vigil.evaluation.benchdetect import Tally
from vigil_gpu_monitor.vigil.evaluation.envelope import CLASSES
from vigil_gpu_monitor.vigil.evaluation.sensitivity import (
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
