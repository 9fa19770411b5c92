"""Encode and decode ``vigil.jobclock/1``, a sharded job's clock and watermark that
its stage 2 sends back to every stage-1 shard (docs/contract.md, docs/sharding.md).

Each stage-1 shard places samples and seals bins by its own nodes unless it is told
the job's: the job's clock (the median of every node's latest timestamp), the median
clock offset its corrections are measured from, and the job's watermark. Stage 2
writes this message, keyed by job on a compacted topic, each time it evaluates a
bin or the job's watermark moves a bin; every stage-1 worker reads it. The clock is
a summary round trip old when it arrives, so each shard carries it forward from
the moment it sealed the bin the clock was computed from (``bin``) by how far its
own nodes moved since.

Also here: the check of a summary's ``clocks`` (each node's latest time and offset,
what stage 2 computes the job's clock from). Standard library only, like the rest
of the contract; a message that fails raises ``ContractError`` (counted, never a
crash).
"""

from __future__ import annotations

import json
import math
from typing import Any, cast

from vigil_gpu_monitor.contracts import JOBCLOCK_SCHEMA
from vigil_gpu_monitor.contracts.codec import MAX_MESSAGE_BYTES, parse_json
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import JobClock
from vigil_gpu_monitor.contracts.names import job_problem
from vigil_gpu_monitor.contracts.shards import MAX_SHARDS

MAX_BIN = 2 ** 53
MAX_VOTERS = 1 << 24
_FIELDS = {"schema", "job", "shards", "bin_seconds", "next_bin", "max_ts", "clock",
           "reference", "voters", "at", "bin"}


def _bad(path: str, what: str) -> ContractError:
    return ContractError("bad_jobclock", f"{path} {what}")


def _finite(value: Any, path: str, *, null_ok: bool = True) -> float | None:
    if value is None and null_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value):
        raise _bad(path, "must be a finite number" + (" or null" if null_ok else ""))
    return float(value)


def _integer(value: Any, path: str, low: int, high: int, *, null_ok: bool = False) -> None:
    if value is None and null_ok:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(path, f"must be an integer {low}..{high}" + (" or null" if null_ok else ""))


def validate_jobclock(message: Any) -> JobClock:
    """Check one decoded ``vigil.jobclock/1``; return it or raise ``ContractError``."""
    if not isinstance(message, dict):
        raise _bad("jobclock", "must be an object")
    if message.get("schema") != JOBCLOCK_SCHEMA:
        raise ContractError("unknown_schema", f"schema {message.get('schema')!r}, "
                                              f"expected {JOBCLOCK_SCHEMA!r}")
    if set(message) != _FIELDS:
        extra, missing = set(message) - _FIELDS, _FIELDS - set(message)
        raise ContractError("unknown_field" if extra else "missing_field",
                            f"unexpected {sorted(extra)}, missing {sorted(missing)}")
    job = message["job"]
    if not isinstance(job, str) or not job or job_problem(job):
        raise ContractError("bad_name", f"job {str(job)[:80]!r} is not a job id")
    _integer(message["shards"], "shards", 1, MAX_SHARDS)
    if (_finite(message["bin_seconds"], "bin_seconds", null_ok=False) or 0.0) <= 0:
        raise _bad("bin_seconds", "must be positive")
    _integer(message["next_bin"], "next_bin", -MAX_BIN, MAX_BIN, null_ok=True)
    _integer(message["bin"], "bin", -MAX_BIN, MAX_BIN, null_ok=True)
    for key in ("max_ts", "clock", "reference", "at"):
        _finite(message[key], key)
    _integer(message["voters"], "voters", 0, MAX_VOTERS)
    return cast(JobClock, message)


def decode_jobclock(raw: bytes | str) -> JobClock:
    """Bytes from Kafka → a validated job clock (``ContractError`` otherwise)."""
    return validate_jobclock(parse_json(raw))


def encode_jobclock(clock: JobClock) -> bytes:
    """A job clock → compact UTF-8 JSON, validated first."""
    raw = json.dumps(validate_jobclock(clock), separators=(",", ":"), allow_nan=False,
                     ensure_ascii=False).encode()
    if len(raw) > MAX_MESSAGE_BYTES:  # a few hundred bytes: never, unless the job id
        raise ContractError("too_large", f"job clock of {len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    return raw


def validate_clocks(value: Any, limit: int) -> None:
    """Check a summary's ``clocks``: node → [latest raw ts, offset or null], at most
    ``limit`` nodes (node names are checked with the summary's other nodes)."""
    if not isinstance(value, dict) or len(value) > limit:
        raise ContractError("bad_summary", f"clocks must be an object of at most {limit} nodes")
    for node, pair in value.items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise ContractError("bad_summary", f"clocks.{node[:80]} must be [latest, offset]")
        try:
            _finite(pair[0], "latest", null_ok=False)
            _finite(pair[1], "offset")
        except ContractError as exc:
            raise ContractError("bad_summary", f"clocks.{node[:80]}: {exc.detail}") from None


__all__ = ["decode_jobclock", "encode_jobclock", "validate_clocks", "validate_jobclock"]
