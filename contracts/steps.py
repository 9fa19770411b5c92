"""Encode and decode ``vigil.step/1``: per-rank step timings, batched by node.

The rules are ``docs/contract.md``'s; ``contracts/schemas/step-1.json`` says the same
in JSON Schema, and a test checks the two agree. As for samples (DESIGN principle
14), one bad step costs that step: ``drop_bad_steps`` takes out a step whose numbers
are not finite, negative, or impossible (compute longer than the step), and the
lenient ``decode_steps(raw, dropped=[...])`` judges the rest. What stays fatal to a
whole message is what makes it unreadable or untrusted: broken JSON, a wrong schema,
an unknown field, a bad identifier, too many ranks or steps.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple, cast

from vigil_gpu_monitor.contracts import STEP_SCHEMA
from vigil_gpu_monitor.contracts.codec import (
    MAX_GPUS,
    _check_fields,
    _check_schema,
    _name,
    _number,
    _object,
    _string,
    parse_json,
)
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import StepBatch
from vigil_gpu_monitor.contracts.names import job_problem, node_problem

MAX_RANKS = MAX_GPUS  # one node's ranks (one a GPU)
MAX_STEPS = 1024  # steps of one rank in one message
MAX_WALL_SECONDS = 86_400.0  # a step longer than a day is a unit error, not a step
MAX_RANK = 1 << 24  # 16 M ranks
COMPUTE_SLACK = 1.01  # compute may exceed wall by this factor (two clocks read apart)

_BATCH_FIELDS = {"schema", "job", "node", "source", "ranks", "meta"}
_RANK_FIELDS = {"rank", "gpu", "stage", "dp", "steps"}
_STEP_FIELDS = {"step", "end", "wall", "compute"}


class DroppedStep(NamedTuple):
    """One step taken out of a batch: which rank (its position in ``ranks``), the
    step's index if it had one, the contract's reason code and the detail."""

    rank: int
    step: Any
    reason: str
    detail: str


def _index(value: Any, path: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError("wrong_type", f"{path} must be an integer")
    if not 0 <= value <= high:
        raise ContractError("out_of_range", f"{path}={value} outside 0..{high}")
    return value


def _check_step(step: Any, path: str) -> None:
    """One step's record, or ContractError naming what is wrong with it."""
    record = _object(step, path)
    _check_fields(record, _STEP_FIELDS, _STEP_FIELDS - {"compute"})
    _index(record["step"], f"{path}.step", 1 << 53)
    if _number(record["end"], f"{path}.end") <= 0:
        raise ContractError("out_of_range", f"{path}.end must be positive Unix seconds")
    wall = _number(record["wall"], f"{path}.wall")
    if not 0 < wall <= MAX_WALL_SECONDS:
        raise ContractError("out_of_range",
                            f"{path}.wall={wall} outside (0, {MAX_WALL_SECONDS:g}] s")
    if "compute" in record:
        compute = _number(record["compute"], f"{path}.compute")
        if not 0 <= compute <= wall * COMPUTE_SLACK:
            raise ContractError("out_of_range", f"{path}.compute={compute} outside 0..wall={wall}")


def drop_bad_steps(batch: Any) -> list[DroppedStep]:
    """Take out of ``batch`` (in place) every step record the contract refuses on its
    own and return what was taken. A rank left with no steps stays (validation then
    refuses nothing for it); anything else wrong is left for ``validate_step_batch``."""
    dropped: list[DroppedStep] = []
    if not isinstance(batch, dict) or not isinstance(batch.get("ranks"), list):
        return dropped
    for r, rank in enumerate(batch["ranks"]):
        if not isinstance(rank, dict) or not isinstance(rank.get("steps"), list):
            continue
        kept = []
        for s, step in enumerate(rank["steps"]):
            try:
                _check_step(step, f"ranks.{r}.steps.{s}")
            except ContractError as exc:
                index = step.get("step") if isinstance(step, dict) else None
                dropped.append(DroppedStep(r, index, exc.reason, exc.detail))
                continue
            kept.append(step)
        rank["steps"] = kept
    return dropped


def validate_step_batch(message: Any) -> StepBatch:
    """Check one decoded ``vigil.step/1``; return it unchanged or raise ContractError."""
    batch = _object(message, "step batch")
    _check_schema(batch, STEP_SCHEMA)
    _check_fields(batch, _BATCH_FIELDS, {"schema", "job", "node", "ranks"})
    _string(batch["job"], "job", empty_ok=False)
    _name(batch["job"], "job", job_problem)
    _name(batch["node"], "node", node_problem)
    if "source" in batch:
        _string(batch["source"], "source", empty_ok=False)
    if "meta" in batch:
        _object(batch["meta"], "meta")
    ranks = batch["ranks"]
    if not isinstance(ranks, list):
        raise ContractError("wrong_type", "ranks must be an array")
    if not 1 <= len(ranks) <= MAX_RANKS:
        raise ContractError("out_of_range", f"{len(ranks)} ranks, expected 1..{MAX_RANKS}")
    for r, rank in enumerate(ranks):
        path = f"ranks.{r}"
        entry = _object(rank, path)
        _check_fields(entry, _RANK_FIELDS, {"rank", "steps"})
        if entry["rank"] is not None:
            _index(entry["rank"], f"{path}.rank", MAX_RANK)
        if "gpu" in entry:
            gpu = entry["gpu"]
            if not (isinstance(gpu, str) and gpu.isdigit() and gpu.isascii() and len(gpu) <= 3):
                raise ContractError("bad_value", f"{path}.gpu {gpu!r} must be a GPU index")
        for field in ("stage", "dp"):
            if field in entry:
                _index(entry[field], f"{path}.{field}", MAX_RANK)
        steps = entry["steps"]
        if not isinstance(steps, list):
            raise ContractError("wrong_type", f"{path}.steps must be an array")
        if len(steps) > MAX_STEPS:
            raise ContractError("out_of_range", f"{path}: {len(steps)} steps > {MAX_STEPS}")
        for s, step in enumerate(steps):
            _check_step(step, f"{path}.steps.{s}")
    return cast(StepBatch, batch)


def decode_steps(raw: bytes | str, dropped: list[DroppedStep] | None = None) -> StepBatch:
    """Bytes from Kafka or a trace line → a validated step batch.

    Strict by default; with a ``dropped`` list, lenient as the worker is: bad step
    records are taken out and appended to it, and the rest is judged as usual."""
    if dropped is None:
        return validate_step_batch(parse_json(raw))
    message = parse_json(raw, constants=True)
    dropped.extend(drop_bad_steps(message))
    return validate_step_batch(message)


def encode_steps(batch: StepBatch | Mapping[str, Any]) -> bytes:
    """A step batch → compact UTF-8 JSON, validated first so nothing bad is published."""
    return json.dumps(validate_step_batch(batch), separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False).encode()
