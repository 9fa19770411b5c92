"""`vigil replay --shards K`: each job split into K stage-1 shards and a stage 2 in
one process (or, with ``--jobs N``, in each of N processes) gives one stage's
detections in its order, on a trace with node moves, bad lines and a repaired
reading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vigil.test_replay_jobs import _replay, _trace
from vigil_gpu_monitor.vigil.cli import main


def test_shards_give_one_stage_detections_in_its_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path)
    one = _replay(trace, tmp_path / "one.jsonl")
    assert len({json.loads(d)["job"] for d in one.splitlines()}) == 3
    capsys.readouterr()
    for k in ("2", "3"):
        assert _replay(trace, tmp_path / f"{k}.jsonl", "--shards", k) == one
        assert f"{k} shards a job" in capsys.readouterr().err
    # and with the jobs over processes: each process runs its jobs in shards
    assert _replay(trace, tmp_path / "jobs.jsonl", "--shards", "2", "--jobs", "2") == one
    err = capsys.readouterr().err
    assert "2 processes, 2 shards a job" in err, err


@pytest.mark.parametrize("args", [["--shards", "0"], ["--shards", "x"]])
def test_bad_shard_arguments_are_an_error_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    trace = _trace(tmp_path)
    try:
        code = main(["replay", str(trace), "--out", str(tmp_path / "o.jsonl"), *args])
    except SystemExit as exc:  # argparse's own refusal
        code = int(exc.code or 0)
    assert code != 0
    assert "Traceback" not in capsys.readouterr().err
