"""A bounded on-disk queue for samples that do not fit the publisher's memory buffer.

Records (key, value) are appended to segment files ``spool-<n>.seg`` of at most
``segment_bytes``; reading takes the oldest segment whole. When the spool would
exceed ``max_bytes``, the oldest segment is deleted and its records are counted as
dropped (exactly: each segment's record count is known). Records of a segment
being read stay on disk until the segment is fully handed out, and segments left by
a previous run are read first, so an agent stopped while Kafka was down resumes
where it was. A segment is deleted once all its records were handed out; after a
crash, a segment that was being sent is sent again (at least once: a repeated
sample lands in the same window bin and changes nothing the detectors read).

Record format: 4-byte big-endian key length, 4-byte value length, key, value. A
torn tail (a crash mid-write) is detected by length and ignored, counted in
``corrupt``.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from pathlib import Path

log = logging.getLogger(__name__)
_HEADER = struct.Struct(">II")
Record = tuple[bytes, bytes]


class DiskSpool:
    """FIFO of (key, value) records on disk, bounded in bytes."""

    def __init__(self, directory: str | Path, max_bytes: int = 512 << 20,
                 segment_bytes: int = 4 << 20) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.dropped = 0
        self.corrupt = 0
        self._segments: deque[Path] = deque(sorted(self.dir.glob("spool-*.seg"),
                                                   key=lambda p: int(p.stem[6:])))
        self._counts: dict[Path, int] = {}
        self._next = int(self._segments[-1].stem[6:]) + 1 if self._segments else 0
        self._writer: Path | None = None
        self._reading: deque[Record] = deque()
        self._reading_path: Path | None = None
        self._bytes = sum(p.stat().st_size for p in self._segments)
        self._records = sum(self._count(p) for p in self._segments)

    def _count(self, path: Path) -> int:
        if path not in self._counts:
            self._counts[path] = len(self._load(path, count_corrupt=False))
        return self._counts[path]

    def __len__(self) -> int:
        """Records spooled and not yet handed out."""
        return self._records + len(self._reading)

    @property
    def size_bytes(self) -> int:
        """Bytes the spool holds on disk."""
        return self._bytes

    def append(self, key: bytes, value: bytes) -> None:
        """Write one record; the oldest segment goes (counted) if the spool is full."""
        size = _HEADER.size + len(key) + len(value)
        if self._writer is None or self._writer.stat().st_size + size > self.segment_bytes:
            self._roll()
        while self._bytes + size > self.max_bytes and len(self._segments) > 1:
            self._drop_oldest()
        assert self._writer is not None
        with open(self._writer, "ab") as fh:
            fh.write(_HEADER.pack(len(key), len(value)) + key + value)
        self._bytes += size
        self._records += 1
        self._counts[self._writer] = self._counts.get(self._writer, 0) + 1

    def _roll(self) -> None:
        self._writer = self.dir / f"spool-{self._next}.seg"
        self._next += 1
        self._writer.touch()
        self._segments.append(self._writer)
        self._counts[self._writer] = 0

    def _drop_oldest(self) -> None:
        oldest = self._segments.popleft()
        lost = self._count(oldest)
        self.dropped += lost
        self._records -= lost
        self._bytes -= oldest.stat().st_size
        self._counts.pop(oldest, None)
        oldest.unlink(missing_ok=True)
        log.warning("spool full: dropped %d oldest samples (%s)", lost, oldest.name)

    def pop(self) -> Record | None:
        """The oldest record, or None when the spool is empty."""
        if not self._reading:
            self._finish_reading()
            if not self._segments:
                return None
            path = self._segments.popleft()
            if path == self._writer:
                self._writer = None  # never append to a segment being read
            self._reading = deque(self._load(path, count_corrupt=True))
            self._reading_path = path
            self._records -= self._counts.pop(path, len(self._reading))
            if not self._reading:
                return self.pop()
        return self._reading.popleft()

    def _finish_reading(self) -> None:
        """Delete the segment whose records have all been handed out."""
        if self._reading_path is not None:
            self._bytes -= self._reading_path.stat().st_size
            self._reading_path.unlink(missing_ok=True)
            self._reading_path = None

    def _load(self, path: Path, count_corrupt: bool) -> list[Record]:
        data = path.read_bytes()
        out, pos = [], 0
        while pos + _HEADER.size <= len(data):
            klen, vlen = _HEADER.unpack_from(data, pos)
            end = pos + _HEADER.size + klen + vlen
            if end > len(data):
                break
            out.append((data[pos + _HEADER.size:pos + _HEADER.size + klen],
                        data[pos + _HEADER.size + klen:end]))
            pos = end
        if pos != len(data) and count_corrupt:
            self.corrupt += 1
            log.warning("spool segment %s has a torn tail (%d bytes ignored)", path.name,
                        len(data) - pos)
        return out

    def sync(self) -> None:
        """Make what was written durable (called on shutdown)."""
        if self._writer is not None and self._writer.exists():
            fd = os.open(self._writer, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
