"""The shapes of Vigil's messages as ``TypedDict``s (standard library), so that mypy
catches a misspelt or missing key where a message is built or read.

They describe the JSON objects of ``docs/contract.md`` after validation; the JSON
Schemas (``contracts/schemas``) and the validators (``contracts.codec``) stay the
checks at run time.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

Readings = dict[str, float]  # metric → value, in the catalog's units


class Sample(TypedDict):
    """``vigil.sample/1``: one node's readings at one time."""

    schema: str
    ts: float
    job: str
    node: str
    gpus: dict[str, Readings]  # GPU index → readings
    host: Readings
    nics: dict[str, Readings]  # NIC name → readings
    meta: NotRequired[dict[str, Any]]


class Detection(TypedDict):
    """``vigil.detection/1``: one incident's firing or resolved state."""

    schema: str
    id: str
    kind: str
    state: str  # firing, resolved
    severity: str  # info, warning, critical
    job: str
    node: str | None
    gpu: str | None
    started_at: float
    detected_at: float
    metrics: list[str]
    score: float
    summary: str
    evidence: dict[str, Any]


class Action(TypedDict):
    """A remediation action as planned, and (with the decision fields) as audited on
    ``vigil.actions``."""

    id: str
    action: str  # drain_and_replace, reset_gpu, cordon
    job: str
    node: str
    gpu: str | None
    incident: str
    summary: str
    job_nodes: int
    planned_at: float
    due_at: float
    job_slowdown: NotRequired[float | None]  # the cost estimate behind the action
    gpu_hours_lost_per_hour: NotRequired[float | None]
    decision: NotRequired[str]  # executed, dry_run, skipped, escalated, failed
    why: NotRequired[str]
    decided_at: NotRequired[float]
    executor: NotRequired[str]
    dry_run: NotRequired[bool]


class JobStatus(TypedDict):
    """``vigil.status/1`` of a job: the last evaluated bin's heat per GPU."""

    schema: str
    kind: Literal["job"]
    job: str
    ts: float
    worker: str
    metrics: list[str]
    heat: dict[str, list[float | None]]  # "node/gpu" → one value per metric
    late: int


class WorkerStatus(TypedDict):
    """``vigil.status/1`` of a worker: its heartbeat."""

    schema: str
    kind: Literal["worker"]
    worker: str
    ts: float
    lag: dict[str, int]  # partition → messages behind
    samples: int
    deadletters: int
    jobs: int


def location(node: str | None, gpu: str | None) -> str:
    """Where a detection or action is, as a person reads it: ``whole job`` (job-level),
    ``node``, or ``node GPU 3``. Every view and alert text uses this one form."""
    if node is None:
        return "whole job"
    return node if gpu is None else f"{node} GPU {gpu}"


class StepTiming(TypedDict):
    """One step of one rank in ``vigil.step/1``: its index, when it ended, how long it
    took on this rank, and (where known) how long the rank computed before it waited
    for the others."""

    step: int
    end: float
    wall: float
    compute: NotRequired[float]


class RankSteps(TypedDict):
    """One rank's steps in ``vigil.step/1``: where it runs and what it is in the job."""

    rank: int | None  # global rank; null: the job's step as one logger saw it
    gpu: NotRequired[str]  # local GPU index on the node, as in samples
    stage: NotRequired[int]  # pipeline stage
    dp: NotRequired[int]  # data-parallel rank
    steps: list[StepTiming]


class StepBatch(TypedDict):
    """``vigil.step/1``: one node's ranks, for one or more steps (key = job id)."""

    schema: str
    job: str
    node: str
    source: NotRequired[str]  # witness, megatron-log, deepspeed-log, simulator, ...
    ranks: list[RankSteps]
    meta: NotRequired[dict[str, Any]]
