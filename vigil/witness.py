"""``vigil.witness``: training code tells the node agent how long each step took.

Standard library only, importable anywhere a training loop runs. Call ``step()``
once a step, after the optimizer step::

    from vigil_gpu_monitor.vigil.witness import Witness
    witness = Witness()              # job, rank, GPU from Slurm / torchrun variables
    for batch in loader:
        ...                          # forward, backward
        compute = ...                # optional: seconds before the gradient wait
        optimizer.step()
        witness.step(compute=compute)

``step`` is non-blocking and bounded: it notes the step in memory and, at most once
every ``flush_seconds`` (or every ``batch`` steps), sends what it holds to the node
agent as one datagram on a local Unix socket (``VIGIL_WITNESS_SOCKET``, default
``/run/vigil/witness.sock``), a non-blocking ``sendto``. When the agent is away, its
socket full or the path missing, the steps are dropped and counted (``dropped``);
nothing is queued beyond one datagram's worth, nothing is retried, and no
exception ever reaches the training loop (``errors`` counts the unexpected).

The step's wall time is measured here (from the previous call) unless given; its
end is the call's wall-clock time. ``compute`` is what the caller measured: the
time the rank worked before it waited for its peers (see ``docs/contract.md``,
``vigil.step/1``); leave it out where it is not known. Examples for plain PyTorch
and for Megatron's timers: ``docs/witness.md``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Mapping

DEFAULT_SOCKET = "/run/vigil/witness.sock"
WIRE_VERSION = 1
MAX_BATCH = 64  # steps in one datagram (well under the socket's datagram limit)


def _env_int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def _local_gpu(env: Mapping[str, str], local_rank: int | None) -> str | None:
    """The GPU index the agent knows this rank by: the local rank's entry of
    ``CUDA_VISIBLE_DEVICES`` where that lists indices, else the local rank."""
    if local_rank is None:
        return None
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.isdigit() for v in visible) and local_rank < len(visible):
        return visible[local_rank]
    return str(local_rank)


class Witness:
    """One rank's step recorder. Every argument left out is read from the
    environment (Slurm's and torchrun's variables)."""

    def __init__(self, job: str | None = None, rank: int | None = None,
                 gpu: str | None = None, stage: int | None = None, dp: int | None = None,
                 path: str | None = None, flush_seconds: float = 1.0,
                 batch: int = MAX_BATCH, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.job = job or env.get("VIGIL_JOB") or env.get("SLURM_JOB_ID") or ""
        self.rank = rank if rank is not None else _env_int(env, "RANK", "SLURM_PROCID")
        local = _env_int(env, "LOCAL_RANK", "SLURM_LOCALID")
        self.gpu = gpu if gpu is not None else _local_gpu(env, local)
        self.stage, self.dp = stage, dp
        self.path = path or env.get("VIGIL_WITNESS_SOCKET") or DEFAULT_SOCKET
        self.flush_seconds = flush_seconds
        self.batch = max(1, min(batch, MAX_BATCH))
        self.sent = 0  # steps handed to the agent
        self.dropped = 0  # steps lost: the agent away, its socket full
        self.errors = 0  # anything else that went wrong (never raised)
        self._pending: list[list[float | int | None]] = []
        self._index = 0
        self._last: float | None = None
        self._flushed = time.monotonic()
        self._header = json.dumps({"v": WIRE_VERSION, "job": self.job, "rank": self.rank,
                                   "gpu": self.gpu, "stage": stage, "dp": dp},
                                  separators=(",", ":"))[:-1]  # closed with the steps
        self._sock: socket.socket | None = None
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        except OSError:
            self.errors += 1

    def step(self, step: int | None = None, compute: float | None = None,
             wall: float | None = None) -> None:
        """Note one step (its index: counted from 0 here unless given); send the
        steps held when it is time. Never blocks, never raises."""
        try:
            now = time.monotonic()
            if wall is None:
                wall = None if self._last is None else now - self._last
            self._last = now
            index = self._index if step is None else step
            self._index = index + 1
            if wall is None or not (0 < wall < 86_400) or not math.isfinite(wall):
                return  # the first call only starts the clock
            if compute is not None and not (0 <= compute <= wall * 1.01):
                compute = None  # a caller's timer that does not fit the step: not sent
            wall = max(round(wall, 6), 1e-6)  # a step never rounds to no time at all
            self._pending.append([index, round(time.time(), 4), wall,
                                  None if compute is None else min(round(compute, 6), wall)])
            if len(self._pending) >= self.batch or now - self._flushed >= self.flush_seconds:
                self.flush()
        except Exception:  # the training loop must never see our failure
            self.errors += 1
            self._pending.clear()

    def flush(self) -> None:
        """Send the steps held, or drop (and count) them. Never blocks, never raises."""
        pending, self._pending = self._pending, []
        self._flushed = time.monotonic()
        if not pending:
            return
        try:
            if self._sock is None:
                self.dropped += len(pending)
                return
            payload = f'{self._header},"steps":{json.dumps(pending, separators=(",", ":"))}}}'
            self._sock.sendto(payload.encode(), self.path)
            self.sent += len(pending)
        except OSError:  # no agent, no socket file, its queue full (EAGAIN): dropped
            self.dropped += len(pending)
        except Exception:  # never into the training loop
            self.errors += 1
            self.dropped += len(pending)

    def close(self) -> None:
        """Send what is held and release the socket."""
        try:
            self.flush()
            if self._sock is not None:
                self._sock.close()
                self._sock = None
        except Exception:  # never into the training loop
            self.errors += 1
