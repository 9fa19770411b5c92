"""Replay a recorded JSON-lines trace of ``vigil.sample/1`` as a source (one node)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from vigil_gpu_monitor.contracts.codec import decode_trace
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.producers.reading import Reading


class TraceSource:
    """Each ``read`` returns the next sample of ``node`` from the trace (empty at the end)."""

    def __init__(self, path: str | Path, node: str | None = None) -> None:
        self.path = Path(path)
        self.node = node
        self.skipped = 0
        self._samples = self._iter()

    def _iter(self) -> Iterator[Reading]:
        with self.path.open("rb") as fh:
            for sample in decode_trace(fh, self._skip):
                if self.node is None:
                    self.node = sample["node"]
                if sample["node"] == self.node:
                    yield Reading(sample["gpus"], sample["host"], sample["nics"])

    def _skip(self, lineno: int, exc: ContractError) -> None:
        self.skipped += 1

    def read(self, now: float) -> Reading:
        return next(self._samples, Reading())
