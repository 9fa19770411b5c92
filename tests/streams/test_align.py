"""``streams.align.JobAligner``: the order a job's samples and step batches are folded
in, and the bounds on every wait."""

from __future__ import annotations

from vigil_gpu_monitor.streams.align import AlignParams, JobAligner

S, T = ("vigil.samples", 0), ("vigil.steps", 0)


def _order(aligner: JobAligner[str], now: float) -> list[str]:
    return [held.item for _, held in aligner.release(now)]


def test_a_step_batch_goes_right_after_the_sample_that_passes_its_end() -> None:
    a: JobAligner[str] = JobAligner(AlignParams(slack=5.0), now=0.0, state={"timed": True})
    a.add_steps(101.0, T, 0, "steps<=101", now=0.0)
    a.add_steps(103.0, T, 1, "steps<=103", now=0.0)
    for i, ts in enumerate((100.0, 102.0, 104.0)):
        a.add_sample(ts, S, i, f"sample@{ts:g}", now=0.0)
    assert _order(a, 0.0) == ["sample@100", "sample@102", "steps<=101", "sample@104",
                              "steps<=103"]


def test_samples_wait_for_the_timings_to_come_within_the_slack() -> None:
    a: JobAligner[str] = JobAligner(AlignParams(slack=5.0), now=0.0, state={"timed": True})
    a.add_steps(100.0, T, 0, "steps<=100", now=0.0)
    for i, ts in enumerate((104.0, 106.0)):
        a.add_sample(ts, S, i, f"sample@{ts:g}", now=0.0)
    assert _order(a, 0.0) == ["sample@104", "steps<=100"]  # 106 > 100 + 5: it waits
    assert a.floor(S) == 1 and a.floor(T) is None  # and holds the commit at its offset
    a.add_steps(102.0, T, 1, "steps<=102", now=1.0)
    assert _order(a, 1.0) == ["steps<=102", "sample@106"]  # 102 <= 104, folded already


def test_a_new_job_waits_for_timings_only_its_first_wait() -> None:
    a: JobAligner[str] = JobAligner(AlignParams(first_wait_seconds=3.0), now=0.0)
    a.add_sample(100.0, S, 0, "s", now=0.0)
    assert _order(a, 2.9) == [] and a.timed is None
    assert _order(a, 3.0) == ["s"] and a.timed is False
    a.add_sample(101.0, S, 1, "s2", now=3.0)
    assert _order(a, 3.0) == ["s2"]  # a samples-only job: no wait any more


def test_timings_that_stop_are_not_waited_for_after_the_quiet_time() -> None:
    a: JobAligner[str] = JobAligner(AlignParams(quiet_seconds=10.0), now=0.0,
                                    state={"timed": True})
    a.add_steps(100.0, T, 0, "t", now=0.0)
    a.add_sample(99.0, S, 0, "s99", now=0.0)
    assert _order(a, 0.0) == ["s99"]
    a.add_sample(200.0, S, 1, "s200", now=5.0)  # the witness stopped at 100
    assert _order(a, 5.0) == ["t"]  # 100 < 200 - 5: the timings go before the gap
    assert _order(a, 9.9) == []
    assert _order(a, 10.0) == ["s200"] and a.timed is False and a.forced["quiet"] == 1


def test_a_job_never_holds_more_than_max_held() -> None:
    a: JobAligner[int] = JobAligner(AlignParams(max_held=100), now=0.0, state={"timed": True})
    a.add_sample(0.0, S, 0, 0, now=0.0)
    a.release(0.0)
    for i in range(1, 150):  # timings ahead of every sample still to come
        a.add_steps(float(i), T, i, i, now=0.0)
        a.release(0.0)
        assert a.held <= 100
    assert a.forced["full"] == 49
