"""Commit clamping on the installed Faust's consumer (no broker needed: no I/O happens)."""

from __future__ import annotations

import faust
from faust.types import TP

from vigil_gpu_monitor.streams.continuity import clamp_commits
from vigil_gpu_monitor.streams.offsets import OffsetGuard

SAMPLES = "t.vigil.samples"


def _consumer() -> object:
    app = faust.App("clamp-test", broker="kafka://127.0.0.1:1", store="memory://",
                    web_enabled=False)
    app.topic(SAMPLES)
    return app.consumer


def test_the_private_faust_attributes_the_clamp_relies_on_exist() -> None:
    consumer = _consumer()
    for name in ("_new_offset", "_acked", "_acked_index", "_committed_offset",
                 "_filter_committable_offsets", "_commit"):
        assert hasattr(consumer, name), f"faust-streaming changed: {name} is gone"


def test_commits_never_pass_what_the_guard_processed() -> None:
    consumer = _consumer()
    guard = OffsetGuard()
    clamp_commits(consumer, SAMPLES, guard)
    tp, other = TP(SAMPLES, 2), TP("t.other", 0)
    # Faust acknowledged 375..900 (a skipped block of stale messages included) ...
    consumer._acked[tp].extend(range(375, 901))
    consumer._acked_index[tp].update(range(375, 901))
    assert consumer._filter_committable_offsets([tp]) == {}  # not anchored: nothing
    assert not consumer._acked[tp]  # (and the acknowledgements are not kept)
    consumer._acked[tp].extend(range(375, 901))
    consumer._acked_index[tp].update(range(375, 901))
    guard.anchor(tp, 375)
    for offset in range(375, 400):  # ... but only 375..399 reached the detectors
        guard.admit(tp, offset)
    assert consumer._filter_committable_offsets([tp]) == {tp: 400}
    # Acknowledgements below the limit are dropped, so the lists stay bounded.
    assert min(consumer._acked[tp]) == 400 and 399 not in consumer._acked_index[tp]
    # Other topics keep Faust's own rule.
    consumer._acked[other].extend([0, 1, 2, 3])
    assert consumer._filter_committable_offsets([other]) == {other: 4}

