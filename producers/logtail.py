"""The node agent's log-tail source: a job's step times from its own log, no code change.

A pattern is a regular expression with named groups: ``step`` (the iteration's
index, required), and the step's time as ``ms`` or ``seconds`` where the line says
it; ``ts`` the line's own timestamp (read with the pattern's ``time_format``, the
node's local time). A line with no step time gets one from the timestamps of the
last matched line: ``(ts − ts_before) / (step − step_before)`` (DeepSpeed prints
throughput, not time). Defaults (verbatim lines in ``tests/producers/fixtures/logs``):

- ``megatron``: ``iteration N/ M | … | elapsed time per iteration (ms): T | …``, with
  or without the leading ``[YYYY-MM-DD HH:MM:SS]``. ``T`` is the mean over the
  ``--log-interval`` iterations ending at ``N``.
- ``deepspeed``: the throughput timer's line, ``[YYYY-MM-DD HH:MM:SS,mmm] … [timer.py:L:stop]
  epoch=E/micro_step=M/global_step=N, …`` (newer releases) or ``… E/N, SamplesPerSec=…``
  (older).

Each step becomes a ``vigil.step/1`` record of one rank of unknown identity (``rank``
null: the job's step as its logging rank saw it), so only a job-level slowdown and its
cost come from it. The tail is bounded: at most ``max_bytes`` read a poll, a partial
line kept up to ``MAX_LINE`` bytes (a longer one is dropped and counted), and a file
that shrank or was replaced is read again from its start.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import IO

from vigil_gpu_monitor.contracts import STEP_SCHEMA
from vigil_gpu_monitor.contracts.messages import StepBatch, StepTiming

MAX_LINE = 64 << 10


@dataclass(frozen=True)
class LogPattern:
    """A named pattern and how to read its timestamp."""

    name: str
    regex: str
    time_format: str = "%Y-%m-%d %H:%M:%S"


PATTERNS = {
    "megatron": LogPattern(
        "megatron",
        r"(?:\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] )?iteration\s+(?P<step>\d+)/\s*\d+ \|"
        r".*?elapsed time per iteration \(ms\): (?P<ms>[0-9.]+)"),
    "deepspeed": LogPattern(
        "deepspeed",
        r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[INFO\] \[timer\.py:\d+:stop\] "
        r"(?:epoch=\d+/micro_step=\d+/global_step=|\d+/)(?P<step>\d+),",
        "%Y-%m-%d %H:%M:%S,%f"),
}


class StepLineParser:
    """Lines → step records, one pattern; remembers the last match for derived times."""

    def __init__(self, pattern: LogPattern) -> None:
        self.pattern = pattern
        self.regex = re.compile(pattern.regex)
        if "step" not in self.regex.groupindex:
            raise ValueError(f"log pattern {pattern.name!r} has no (?P<step>...) group")
        self._before: tuple[int, float] | None = None  # last (step, timestamp)
        self.matched = 0

    def _timestamp(self, text: str | None) -> float | None:
        if not text:
            return None
        try:
            return time.mktime(time.strptime(text.split(",")[0], self.pattern.time_format.split(
                ",")[0])) + (int(text.split(",")[1]) / 1000 if "," in text else 0.0)
        except (ValueError, IndexError, OverflowError):
            return None

    def parse(self, line: str, now: float) -> StepTiming | None:
        """The step record a line holds, or None (no match, or no time yet)."""
        found = self.regex.search(line)
        if found is None:
            return None
        self.matched += 1
        groups = found.groupdict()
        step = int(groups["step"])
        stamp = self._timestamp(groups.get("ts"))
        wall: float | None = None
        if groups.get("ms"):
            wall = float(groups["ms"]) / 1000
        elif groups.get("seconds"):
            wall = float(groups["seconds"])
        before = self._before
        if stamp is not None:
            self._before = (step, stamp)
        if wall is None and stamp is not None and before is not None and step > before[0]:
            wall = (stamp - before[1]) / (step - before[0])
        if wall is None or not 0 < wall <= 86_400:
            return None
        return {"step": step, "end": stamp if stamp is not None else now, "wall": round(wall, 6)}


class LogTail:
    """Follows one log file and turns its new lines into step batches."""

    def __init__(self, path: str, pattern: LogPattern, node: str, job: str,
                 max_bytes: int = 1 << 20, from_start: bool = False) -> None:
        self.path, self.node, self.job = path, node, job
        self.parser = StepLineParser(pattern)
        self.max_bytes = max_bytes
        self.dropped: Counter[str] = Counter()
        self._fh: IO[bytes] | None = None
        self._inode: int | None = None
        self._partial = b""
        self._from_start = from_start
        if not self._open():  # where the log ends now: what comes after is news
            self._from_start = True  # no log yet: all of the one that appears is news

    def _open(self) -> bool:
        try:
            info = os.stat(self.path)
        except OSError:
            return False
        if self._fh is not None and (info.st_ino != self._inode or info.st_size < self._fh.tell()):
            self._fh.close()  # rotated or truncated: read the new file from its start
            self._fh, self._partial, self._from_start = None, b"", True
        if self._fh is None:
            self._fh = open(self.path, "rb")  # kept open between polls
            self._inode = info.st_ino
            if not self._from_start:
                self._fh.seek(0, os.SEEK_END)  # a job's past steps are history, not news
        return True

    def poll(self, now: float | None = None) -> StepBatch | None:
        """New complete lines since the last poll → one batch (None: no step)."""
        if not self._open() or self._fh is None:
            return None
        data = self._partial + self._fh.read(self.max_bytes)
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self.dropped["line_too_long"] += 1
            self._partial = b""
        stamp = time.time() if now is None else now
        steps = []
        for raw in lines:
            record = self.parser.parse(raw.decode("utf-8", "replace"), stamp)
            if record is not None:
                steps.append(record)
        if not steps:
            return None
        return {"schema": STEP_SCHEMA, "job": self.job, "node": self.node,
                "source": f"{self.parser.pattern.name}-log",
                "ranks": [{"rank": None, "steps": steps[-1024:]}]}

    def close(self) -> None:
        """Release the file."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None
