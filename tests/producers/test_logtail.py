"""The log-tail source on real Megatron and DeepSpeed lines (verbatim fixtures,
``tests/producers/fixtures/logs/SOURCES.md``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.steps import validate_step_batch
from vigil_gpu_monitor.producers.logtail import PATTERNS, LogPattern, LogTail, StepLineParser

LOGS = Path(__file__).parent / "fixtures" / "logs"


def _tail(name: str, pattern: str) -> list[dict]:  # type: ignore[type-arg]
    tail = LogTail(str(LOGS / name), PATTERNS[pattern], "node-1", "job-1", from_start=True)
    batch = tail.poll(now=1_800_000_000.0)
    tail.close()
    assert batch is not None
    validate_step_batch(batch)
    return list(batch["ranks"][0]["steps"])


def test_megatron_iteration_lines_with_their_timestamps() -> None:
    steps = _tail("megatron_issue756.log", "megatron")
    assert [(s["step"], s["wall"]) for s in steps] == [(71, 5.3616), (72, 5.4707),
                                                        (73, 5.8299)]
    ends = [s["end"] for s in steps]
    assert ends[1] - ends[0] == 6.0 and ends[0] == time.mktime(
        time.strptime("2024-04-06 03:02:12", "%Y-%m-%d %H:%M:%S"))


def test_megatron_lines_without_timestamps_end_when_read() -> None:
    steps = _tail("megatron_llm_issue11.log", "megatron")
    assert [s["step"] for s in steps] == [122, 123, 124, 125]
    assert steps[0]["wall"] == 86.5452 and {s["end"] for s in steps} == {1_800_000_000.0}


def test_deepspeed_step_times_come_from_its_timer_lines_timestamps() -> None:
    steps = _tail("deepspeed_issue1825.log", "deepspeed")
    # 10 steps between 02:06:58.985 and 02:07:14.130; the first line only starts the clock
    assert [s["step"] for s in steps] == [50]
    assert steps[0]["wall"] == pytest.approx(1.5145)


def test_the_newer_deepspeed_timer_line_matches() -> None:
    parser = StepLineParser(PATTERNS["deepspeed"])
    line = (LOGS / "deepspeed_issue5779.log").read_text().splitlines()[0]
    assert parser.parse(line, 0.0) is None and parser.matched == 1  # one line: no time yet


def test_a_pattern_without_a_step_group_is_refused() -> None:
    with pytest.raises(ValueError, match="step"):
        StepLineParser(LogPattern("mine", r"loss: (?P<ms>\d+)"))


def test_the_tail_follows_appends_rotation_and_partial_lines(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    lines = (LOGS / "megatron_issue756.log").read_bytes().splitlines(keepends=True)
    log.write_bytes(b"starting\n")
    tail = LogTail(str(log), PATTERNS["megatron"], "n", "j")
    assert tail.poll() is None  # what was there before: history
    with log.open("ab") as fh:
        fh.write(lines[0] + lines[1][:40])  # a line still being written
    first = tail.poll()
    assert first is not None and [s["step"] for s in first["ranks"][0]["steps"]] == [71]
    with log.open("ab") as fh:
        fh.write(lines[1][40:])
    second = tail.poll()
    assert second is not None and [s["step"] for s in second["ranks"][0]["steps"]] == [72]
    log.unlink()
    log.write_bytes(lines[2])  # rotated: a new file
    third = tail.poll()
    assert third is not None and [s["step"] for s in third["ranks"][0]["steps"]] == [73]
    tail.close()


def test_a_missing_log_is_no_error(tmp_path: Path) -> None:
    tail = LogTail(str(tmp_path / "none.log"), PATTERNS["megatron"], "n", "j")
    assert tail.poll() is None


def test_a_log_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    """A job that starts after the agent creates its log then: every line of it is news,
    even those written before the first poll."""
    log = tmp_path / "late.log"
    tail = LogTail(str(log), PATTERNS["megatron"], "n", "j")
    log.write_bytes((LOGS / "megatron_issue756.log").read_bytes())
    batch = tail.poll()
    assert batch is not None and [s["step"] for s in batch["ranks"][0]["steps"]] == [71, 72, 73]
    tail.close()
