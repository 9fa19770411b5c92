"""The agent's disk spool: FIFO across segments, bounded with exact drop counts,
resumed after a restart, a torn tail survived."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from vigil_gpu_monitor.producers.spool import DiskSpool


def _drain(spool: DiskSpool) -> list[bytes]:
    out = []
    while (record := spool.pop()) is not None:
        out.append(record[1])
    return out


def test_fifo_across_segments_and_files_removed(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_bytes=1 << 20, segment_bytes=200)
    values = [f"v{i:03d}".encode() * 5 for i in range(50)]
    for v in values:
        spool.append(b"job", v)
    assert len(spool) == 50 and len(list(tmp_path.glob("*.seg"))) > 5
    assert _drain(spool) == values
    assert len(spool) == 0 and spool.pop() is None
    assert not list(tmp_path.glob("*.seg")) and spool.size_bytes == 0


def test_full_spool_drops_oldest_segments_with_exact_count(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_bytes=2_000, segment_bytes=500)
    for i in range(200):
        spool.append(b"k", f"{i:05d}".encode())
    kept = _drain(spool)
    assert spool.dropped + len(kept) == 200 and spool.dropped > 0
    assert kept == [f"{i:05d}".encode() for i in range(spool.dropped, 200)]  # newest kept
    assert spool.size_bytes == 0


def test_restart_resumes_and_appends_after_old_segments(tmp_path: Path) -> None:
    first = DiskSpool(tmp_path, segment_bytes=100)
    for i in range(20):
        first.append(b"k", f"a{i}".encode())
    first.sync()
    second = DiskSpool(tmp_path, segment_bytes=100)
    assert len(second) == 20
    second.append(b"k", b"new")
    assert _drain(second) == [f"a{i}".encode() for i in range(20)] + [b"new"]


def test_torn_tail_is_ignored_and_counted(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path)
    spool.append(b"k", b"whole")
    spool.sync()
    (seg,) = tmp_path.glob("*.seg")
    with open(seg, "ab") as fh:
        fh.write(b"\x00\x00\x00\x01\x00\x00\x00\x09kpart")  # a crash mid-record
    again = DiskSpool(tmp_path)
    assert _drain(again) == [b"whole"] and again.corrupt == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(min_size=1, max_size=300), st.none()), max_size=120))
def test_interleaved_appends_and_pops_keep_order(tmp_path_factory: object,
                                                 ops: list[bytes | None]) -> None:
    path = tmp_path_factory.mktemp("spool")  # type: ignore[attr-defined]
    spool = DiskSpool(path, max_bytes=1 << 30, segment_bytes=256)
    expected: list[bytes] = []
    got: list[bytes] = []
    for op in ops:
        if op is None:
            record = spool.pop()
            if record is not None:
                got.append(record[1])
        else:
            spool.append(b"k", op)
            expected.append(op)
    got.extend(_drain(spool))
    assert got == expected
