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


class NodeRows(TypedDict):
    """One node's sealed bin in ``vigil.summary/2``: its devices, in the window's order,
    and their means as little-endian float64 (devices × the summary's metrics), NaN
    where nothing was read. On the wire the means travel in the block after the JSON
    header (``contracts/summary.py``)."""

    gpus: list[str]
    gpu_means: bytes
    nics: list[str]
    nic_means: bytes


class NodeHealth(TypedDict):
    """One node's health bookkeeping in ``vigil.summary/2`` (``detectors/health.py``):
    when it was last heard on the job's clock, its cadence, whether its clock is not
    placed yet, and each GPU's state (last seen, throttling, ECC count, open event)."""

    last: float | None
    # [typical interval, ticks due, arrivals, last time on its own clock]; a state kept
    # from before the counts: [typical interval, mean gap]
    cadence: list[float] | None
    unplaced: bool
    gpus: dict[str, dict[str, Any]]


class SummaryEvent(TypedDict):
    """A health finding that fired on one sample (an XID, an ECC rise), with the
    sample's time on the job's clock: stage 2 sends it through the job's incident
    tracker as one stage does at that sample."""

    ts: float
    kind: str
    node: str | None
    gpu: str | None
    severity: str
    metrics: list[str]
    score: float
    summary: str
    since: float
    evidence: dict[str, Any]
    fire_after: int | None


class Summary(TypedDict):
    """``vigil.summary/2``: one stage-1 shard's sealed bin of a job (or, with ``bin``
    null, only the health events of its latest samples), for stage 2 (key = job id).
    A bin of many nodes is sent in ``parts`` messages."""

    schema: str
    job: str
    shard: int
    shards: int
    bin: int | None
    next_bin: int | None  # the shard's next bin to seal when it sent this message
    part: int
    parts: int
    bin_seconds: float
    max_ts: float | None  # the shard's newest placed sample of an established node
    next_data_bin: int | None  # the shard's first open bin after ``bin`` holding data
    late: int  # the shard's late samples so far
    declared: bool | None  # the job's declared synchrony (meta.job_sync), last seen
    gpu_metrics: list[str]
    nic_metrics: list[str]
    nodes: dict[str, NodeRows]  # the nodes with readings in the bin
    health: dict[str, NodeHealth]  # every node the shard keeps (all parts together)
    events: list[SummaryEvent]
    # node → [latest raw ts, clock offset or null] of every node the shard keeps (all
    # parts together), in a bin's summary: what stage 2's job clock rests on
    clocks: NotRequired[dict[str, list[float | None]]]
    # on the job's clock, when the latest of the shard's samples that had waited in its
    # agent for the broker got through (detectors/delivery.py), in a bin's summary
    resumed: NotRequired[float | None]


class JobClock(TypedDict):
    """``vigil.jobclock/1``: a sharded job's clock and watermark, as its stage 2 last
    evaluated it, for every stage-1 shard of the job (key = job id, compacted)."""

    schema: str
    job: str
    shards: int
    bin_seconds: float
    next_bin: int | None  # the job's next bin to evaluate
    max_ts: float | None  # the job's watermark: its newest placed sample, job clock
    clock: float | None  # median of the job's nodes' latest raw timestamps, at ``at``
    reference: float | None  # median of the nodes' clock offsets (null: under 3)
    voters: int  # nodes that vote on the clock
    at: float | None  # the job's watermark at the moment ``clock`` is of
    bin: int | None  # the bin whose summaries ``clock`` was computed from
