"""Replay a recorded JSON-lines trace of ``vigil.sample/1`` as a source (one node)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from contracts.codec import decode_sample
from contracts.errors import ContractError
from producers.reading import Reading


class TraceSource:
    """Each ``read`` returns the next sample of ``node`` from the trace (empty at the end)."""

    def __init__(self, path: str | Path, node: str | None = None) -> None:
        self.path = Path(path)
        self.node = node
        self.skipped = 0
        self._samples = self._iter()

    def _iter(self) -> Iterator[Reading]:
        with self.path.open("rb") as fh:
            for line in fh:
                try:
                    sample = decode_sample(line)
                except ContractError:
                    self.skipped += 1
                    continue
                if self.node is None:
                    self.node = sample["node"]
                if sample["node"] == self.node:
                    yield Reading(sample["gpus"], sample["host"], sample["nics"])

    def read(self, now: float) -> Reading:
        return next(self._samples, Reading())
