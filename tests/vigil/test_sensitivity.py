"""The envelope's sensitivity table is produced: a row per parameter end, each summing
its scenarios (a tiny subset of bench/bench_envelope.py's run)."""

from __future__ import annotations

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
    text = markdown(table)
    assert text.count("\n") == 3 and "| nccl_channels | low | 2 |" in text
    assert "| nccl_channels | high | 32 |" in text
