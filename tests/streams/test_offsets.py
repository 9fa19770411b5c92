"""The offset guard: continuity of what reaches the detectors, whatever Faust delivers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.streams.offsets import OffsetGuard, Verdict


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_in_order_offsets_are_processed_and_move_the_commit_limit() -> None:
    guard = OffsetGuard()
    assert guard.needs_anchor(3) and guard.admit(3, 0) is Verdict.UNANCHORED
    assert guard.commit_limit(3) is None
    guard.anchor(3, 40)
    assert [guard.admit(3, o) for o in (40, 41, 42)] == [Verdict.PROCESS] * 3
    assert guard.commit_limit(3) == 43


def test_a_skipped_block_is_refused_and_refetched_from_the_first_missing_offset() -> None:
    clock = Clock()
    guard = OffsetGuard(refetch_seconds=1.0, clock=clock)
    guard.anchor(2, 375)
    assert guard.admit(2, 813) is Verdict.GAP  # 375..812 never arrived
    assert guard.admit(2, 814) is Verdict.GAP
    assert guard.commit_limit(2) == 375  # nothing past the hole is committable
    assert guard.refetch_due(2) == 375
    assert guard.refetch_due(2) is None  # one seek per interval, not one per message
    clock.now += 1.5
    assert guard.admit(2, 815) is Verdict.GAP
    assert guard.refetch_due(2) == 375
    assert [guard.admit(2, o) for o in range(375, 380)] == [Verdict.PROCESS] * 5
    assert guard.refetch_due(2) is None
    assert guard.commit_limit(2) == 380


def test_replayed_offsets_are_skipped_without_moving_anything() -> None:
    guard = OffsetGuard()
    guard.anchor(0, 10)
    for o in (10, 11, 12):
        guard.admit(0, o)
    assert guard.admit(0, 11) is Verdict.REPLAYED
    assert guard.refetch_due(0) is None and guard.commit_limit(0) == 13


def test_retention_gap_is_accepted_once_the_log_start_is_known() -> None:
    guard = OffsetGuard()
    guard.anchor(1, 100)
    assert guard.admit(1, 500) is Verdict.GAP
    assert guard.accept_log_start(1, 90) == 0  # the log still has 100: no loss, re-fetch
    assert guard.accept_log_start(1, 500) == 400
    assert guard.admit(1, 500) is Verdict.PROCESS and guard.commit_limit(1) == 501


def test_reset_forgets_every_anchor() -> None:
    guard = OffsetGuard()
    guard.anchor(0, 5)
    guard.reset()
    assert guard.needs_anchor(0) and guard.commit_limit(0) is None


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 1000), total=st.integers(1, 200),
       script=st.lists(st.tuples(st.integers(-50, 50), st.integers(1, 30)), max_size=40))
def test_whatever_the_delivery_order_the_processed_offsets_are_one_contiguous_run(
        start: int, total: int, script: list[tuple[int, int]]) -> None:
    """Deliveries jump back and forth (rebalances, seeks); a re-fetch follows every gap.

    Whatever happens, what is processed is start, start+1, ... in order, each once,
    and the commit limit ends one past the last offset. A hole at the very end of a
    partition is found when the next sample arrives (until then the commit stays
    before it).
    """
    clock = Clock()
    guard = OffsetGuard(refetch_seconds=0.0, clock=clock)
    guard.anchor(0, start)
    end = start + total
    processed: list[int] = []

    def deliver(first: int, stop: int) -> None:
        for offset in range(first, stop):
            if guard.admit(0, offset) is Verdict.PROCESS:
                processed.append(offset)

    position = start
    for jump, run in script:
        position = min(max(start, position + jump), end)
        deliver(position, min(position + run, end))
        position = min(position + run, end)
        refetch = guard.refetch_due(0)
        if refetch is not None:
            position = refetch  # the consumer seeks back, as Continuity does
    # The partition keeps receiving samples: one more arrives after everything.
    deliver(position, end + 1)
    refetch = guard.refetch_due(0)
    if refetch is not None:
        deliver(refetch, end + 1)
    assert processed == list(range(start, end + 1))
    assert guard.commit_limit(0) == end + 1


def test_a_hole_no_later_message_shows_is_found_from_the_stalled_position() -> None:
    clock = Clock()
    guard = OffsetGuard(refetch_seconds=1.0, stall_seconds=5.0, clock=clock)
    guard.anchor(0, 100)
    for offset in range(100, 120):
        guard.admit(0, offset)
    guard.check_position(0, 120)  # caught up: nothing to do
    guard.check_position(0, 900)  # the consumer is far ahead, but progress is recent
    assert guard.refetch_due(0) is None
    clock.now += 6
    guard.check_position(0, 900)  # ahead and stalled: a hole
    assert guard.refetch_due(0) == 120
    clock.now += 2  # the re-fetch was dropped too: it is asked again
    assert guard.refetch_due(0) == 120
    guard.admit(0, 120)
    assert guard.refetch_due(0) is None
