"""``vigil.status/1``: the worker's pipeline status, for the live view.

An internal, best-effort topic (``vigil.status``, compacted, key ``job:<id>`` or
``worker:<id>``): the worker publishes each job's latest per-GPU heat (the means of
the last evaluated bin) and its own health (lag, dead letters) every few seconds;
the alerter keeps the newest of each in Redis, where ``vigil top`` reads them.
Not part of CONTRACT.md's stable interface: outside consumers should not build on it.
"""

from __future__ import annotations

import json
from typing import Any

from vigil_gpu_monitor.contracts.codec import MAX_ID_CHARS, parse_json
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import JobStatus, WorkerStatus

STATUS_SCHEMA = "vigil.status/1"
HEAT_METRICS = ("sm_active", "tensor_active", "dram_active")
# how the live view (short) and the report (title) name each heat metric
HEAT_NAMES = {"sm_active": ("SM", "SM activity"),
              "tensor_active": ("TENSOR", "Tensor-core activity"),
              "dram_active": ("DRAM", "DRAM bandwidth utilisation")}
MAX_HEAT_ENTRIES = 100_000


def job_status(job: str, ts: float, worker: str,
               heat: dict[str, list[float | None]], late: int) -> JobStatus:
    """A job's status: ``heat["node/gpu"] = [sm, tensor, dram]`` (None = no reading)."""
    return {"schema": STATUS_SCHEMA, "kind": "job", "job": job, "ts": ts, "worker": worker,
            "metrics": list(HEAT_METRICS), "heat": heat, "late": late}


def worker_status(worker: str, ts: float, lag: dict[str, int], samples: int,
                  deadletters: int, jobs: int) -> WorkerStatus:
    """A worker's heartbeat: lag per partition and its running totals."""
    return {"schema": STATUS_SCHEMA, "kind": "worker", "worker": worker, "ts": ts,
            "lag": lag, "samples": samples, "deadletters": deadletters, "jobs": jobs}


def gpu_key_order(key: str) -> tuple[str, int]:
    """Sort key for ``"node/gpu"`` strings: by node, then GPU index as a number."""
    node, _, gpu = key.rpartition("/")
    return node, int(gpu) if gpu.isdigit() else 0


def feed_key(status: JobStatus | WorkerStatus) -> bytes:
    """The compaction key: the newest status per job and per worker survives."""
    if status["kind"] == "job":
        return f"job:{status['job']}".encode()
    return f"worker:{status['worker']}".encode()


def encode_status(status: JobStatus | WorkerStatus) -> bytes:
    """Compact JSON bytes."""
    return json.dumps(status, separators=(",", ":"), allow_nan=False).encode()


def decode_status(raw: bytes) -> dict[str, Any]:
    """Parse and check a status message; raises ContractError with a reason."""
    status = parse_json(raw)
    if not isinstance(status, dict) or status.get("schema") != STATUS_SCHEMA:
        raise ContractError("unknown_schema", f"expected {STATUS_SCHEMA}")
    kind = status.get("kind")
    if kind not in ("job", "worker"):
        raise ContractError("bad_value", f"status kind {kind!r}")
    name = status.get("job" if kind == "job" else "worker")
    if not isinstance(name, str) or not name or len(name) > MAX_ID_CHARS:
        raise ContractError("bad_value", "status needs a job or worker id")
    if not isinstance(status.get("ts"), int | float):
        raise ContractError("wrong_type", "ts must be a number")
    if kind == "job":
        heat = status.get("heat")
        if not isinstance(heat, dict) or len(heat) > MAX_HEAT_ENTRIES or not all(
                isinstance(v, list) and len(v) == len(HEAT_METRICS)
                and all(x is None or isinstance(x, int | float) for x in v)
                for v in heat.values()):
            raise ContractError("wrong_type", "heat must map node/gpu to "
                                f"{len(HEAT_METRICS)} numbers or nulls")
    elif not isinstance(status.get("lag"), dict):
        raise ContractError("wrong_type", "lag must be an object")
    return status
