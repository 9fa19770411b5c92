"""The node agent's side of ``vigil.witness``: step records in, ``vigil.step/1`` out.

Training processes on the node send datagrams to a Unix socket the agent binds
(``vigil/witness.py`` says what they hold). ``WitnessReceiver.poll`` reads what has
arrived (at most ``max_datagrams`` a poll: bounded work, and the kernel's socket
queue bounds the rest: a full queue makes the witness drop, never block), groups it
by job into one message per job (this node's ranks), drops what the contract
refuses (one bad step costs one step; a datagram that does not parse is counted by
reason) and hands each batch to the sink. Standard library and ``contracts`` only:
the agent stays light.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from vigil_gpu_monitor.contracts import STEP_SCHEMA
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import RankSteps, StepBatch, StepTiming
from vigil_gpu_monitor.contracts.steps import (
    MAX_RANKS,
    MAX_STEPS,
    drop_bad_steps,
    encode_steps,
    validate_step_batch,
)
from vigil_gpu_monitor.producers.publisher import BufferedPublisher

log = logging.getLogger(__name__)
MAX_DATAGRAM = 64 << 10


class StepSink(Protocol):
    def publish_steps(self, batch: StepBatch) -> None: ...


class BufferedStepPublisher(BufferedPublisher):
    """The samples' bounded, never-blocking publisher, for step batches (its own
    topic, buffer and loss count)."""

    def publish_steps(self, batch: StepBatch) -> None:
        """Validate, encode and buffer; never blocks on Kafka."""
        self._append((time.monotonic(), batch["job"].encode(), encode_steps(batch)))


def _steps(raw: Any) -> list[StepTiming]:
    if not isinstance(raw, list):
        raise ContractError("wrong_type", "steps must be an array")
    out: list[StepTiming] = []
    for record in raw:
        if not isinstance(record, list) or len(record) != 4:
            raise ContractError("wrong_type", "a step is [index, end, wall, compute]")
        step: StepTiming = {"step": record[0], "end": record[1], "wall": record[2]}
        if record[3] is not None:
            step["compute"] = record[3]
        out.append(step)
    return out


class WitnessReceiver:
    """Binds ``path`` and turns the witnesses' datagrams into step batches."""

    def __init__(self, path: str, node: str, sink: StepSink,
                 job_of: Callable[[], str] = lambda: "", max_datagrams: int = 4096,
                 mode: int = 0o666) -> None:
        self.path, self.node, self.sink, self.job_of = path, node, sink, job_of
        self.max_datagrams = max_datagrams
        self.received = 0  # steps read
        self.published = 0  # steps handed to the sink
        self.invalid: Counter[str] = Counter()  # reason → datagrams or steps refused
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket file left by an agent that died
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(path)
        self._sock.setblocking(False)
        os.chmod(path, mode)  # training processes run as their users: they must write

    def poll(self) -> int:
        """Read what has arrived, publish it; returns the steps published."""
        ranks: dict[str, dict[tuple[Any, Any], RankSteps]] = {}
        for _ in range(self.max_datagrams):
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                break
            try:
                self._fold(data, ranks)
            except ContractError as exc:
                self.invalid[exc.reason] += 1
        published = 0
        for job, entries in ranks.items():
            batch: StepBatch = {"schema": STEP_SCHEMA, "job": job, "node": self.node,
                                "source": "witness", "ranks": list(entries.values())[:MAX_RANKS]}
            for bad in drop_bad_steps(batch):
                self.invalid[bad.reason] += 1
            batch["ranks"] = [r for r in batch["ranks"] if r["steps"]]
            if not batch["ranks"]:
                continue
            try:
                self.sink.publish_steps(validate_step_batch(batch))
            except ContractError as exc:
                self.invalid[exc.reason] += 1
                log.warning("step batch of job %s not published: %s", job, exc)
                continue
            published += sum(len(r["steps"]) for r in batch["ranks"])
        self.published += published
        return published

    def _fold(self, data: bytes, ranks: dict[str, dict[tuple[Any, Any], RankSteps]]) -> None:
        try:
            message = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise ContractError("invalid_json", "a datagram that is not JSON") from None
        if not isinstance(message, dict) or message.get("v") != 1:
            raise ContractError("unknown_schema", "not a witness datagram of version 1")
        job = message.get("job") or self.job_of()
        if not isinstance(job, str) or not job:
            raise ContractError("bad_value", "no job: the witness named none, the node runs none")
        steps = _steps(message.get("steps"))
        self.received += len(steps)
        where = (message.get("rank"), message.get("gpu"))
        entry = ranks.setdefault(job, {}).get(where)
        if entry is None:
            entry = {"rank": message.get("rank"), "steps": []}
            for field in ("gpu", "stage", "dp"):
                if message.get(field) is not None:
                    entry[field] = message[field]
            ranks[job][where] = entry
        room = MAX_STEPS - len(entry["steps"])
        if len(steps) > room:
            self.invalid["too_many_steps"] += len(steps) - room
        entry["steps"].extend(steps[:max(room, 0)])

    def run(self, interval: float, stop: threading.Event) -> None:
        """Poll every ``interval`` seconds until ``stop`` is set; never raises."""
        while not stop.is_set():
            try:
                self.poll()
            except Exception as exc:  # the agent goes on
                self.invalid[type(exc).__name__] += 1
                log.warning("witness poll failed: %s", exc)
            stop.wait(interval)

    def close(self) -> None:
        """Release the socket and remove its file."""
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
