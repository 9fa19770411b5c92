"""`vigil replay --jobs N`: a trace's jobs spread over N processes, with the same
detections, byte for byte and in the same order, as one process writes.

A job's engine sees only that job's samples, with one exception: a node that reports
under another job has left its old one (``detectors.engine.NodeMoves``), and the old
job's engine is told at that very line. So the parent first reads each line's job,
node and time alone (a msgspec struct of three fields: a fraction of a full parse),
gives each job to a process (the costliest first, each to the least loaded: a job
costs its lines and its bins, ``STEP_LINES``), and works out
every node move with the line it happens at. Each process (forked: the plan is
inherited, not copied through a pipe) then reads the trace, decodes and replays its
own jobs' lines only, and tells its engines of the moves at their lines. Each
detection comes back with the line that produced it; sorted by line (a stable sort:
one line's detections all come from one process, in their order), they are exactly
the sequence one process prints.

The plan assumes a line whose job and node parse is valid. A process that finds one
invalid reports it, and the moves are worked out again without it: where they
change (the invalid line moved a node), or a line's full decode names another job
or node than its quick read (a repeated key), the trace is replayed again in one
process. Either way the output is what one process prints.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from vigil_gpu_monitor.contracts.codec import encode_detection
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.errors import ContractError

log = logging.getLogger("vigil")

SKIP = 255  # the owner of a line no process replays (blank, invalid, or without a job)
MAX_PROCESSES = SKIP - 1
# what a job's evaluated bin costs, in lines ingested: a step of a small job ~2 ms, a
# line ~100 µs (replay of base-5, py-spy). Only the balance between processes rests
# on it: lines alone gave hard-15's process with the many small jobs twice the steps.
STEP_LINES = 20


class _Route(msgspec.Struct):
    """The three fields the plan needs; every other field is skipped unparsed."""

    job: str
    node: str
    ts: float


_route = msgspec.json.Decoder(_Route)


class Move(NamedTuple):
    """Node ``node`` reports under another job from line ``line`` (0-based) on: the
    engine of ``left`` forgets it there."""

    line: int
    left: str
    node: str


@dataclass
class Plan:
    """Which process replays each line, and the node moves each process applies."""

    processes: int
    owner: bytearray  # line → its process (``SKIP``: none)
    job_of: array[int]  # line → index in ``jobs`` (-1: not read)
    node_of: array[int]  # line → index in ``nodes`` (-1: not read)
    jobs: list[str]
    nodes: list[str]
    process_of: dict[str, int]  # job → its process
    invalid: dict[int, str] = field(default_factory=dict)  # line number → why (parent's)
    moves: list[list[Move]] = field(default_factory=list)


@dataclass
class PartResult:
    """What one process sends back."""

    detections: list[tuple[int, bytes]]  # (line, encoded detection), in its order
    invalid: dict[int, str]  # line number (1-based) → the reason it was skipped
    misread: bool  # a line's full decode named another job or node than the plan
    jobs: int
    late: int


def _lines(path: str) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as trace:
        yield from enumerate(trace)


def make_plan(path: str, processes: int, bin_seconds: float = 5.0) -> Plan:
    """Read each line's job, node and time, and give each job to one of
    ``processes``."""
    from vigil_gpu_monitor.streams.decode import decode_sample_fast

    if not 1 <= processes <= MAX_PROCESSES:
        raise ValueError(f"--jobs must be 1..{MAX_PROCESSES}")
    owner = bytearray()
    job_of, node_of = array("i"), array("i")
    job_index: dict[str, int] = {}
    node_index: dict[str, int] = {}
    invalid: dict[int, str] = {}
    span: list[list[float]] = []  # job → [first, last] time
    for i, line in _lines(path):
        route = _read_route(line, i, invalid, decode_sample_fast)
        owner.append(SKIP)
        if route is None:
            job_of.append(-1)
            node_of.append(-1)
            continue
        job, node, ts = route
        j = job_index.setdefault(job, len(job_index))
        job_of.append(j)
        node_of.append(node_index.setdefault(node, len(node_index)))
        if j == len(span):
            span.append([ts, ts])
        elif not span[j][0] <= ts <= span[j][1]:
            span[j] = [min(ts, span[j][0]), max(ts, span[j][1])]
    jobs, nodes = list(job_index), list(node_index)
    # a job's cost: its lines, and its bins (``STEP_LINES`` lines each)
    cost = [STEP_LINES * (last - first) / bin_seconds for first, last in span]
    for j in job_of:
        if j >= 0:
            cost[j] += 1
    load = [0.0] * processes
    process_of: dict[str, int] = {}
    # the costliest first, each to the least loaded process (ties: first seen, lowest)
    for j in sorted(range(len(jobs)), key=lambda j: (-cost[j], j)):
        if not jobs[j]:
            continue  # a sample without a job is replayed by no engine
        p = min(range(processes), key=lambda k: (load[k], k))
        process_of[jobs[j]] = p
        load[p] += cost[j]
    for i, j in enumerate(job_of):
        if j >= 0 and jobs[j]:
            owner[i] = process_of[jobs[j]]
    plan = Plan(processes, owner, job_of, node_of, jobs, nodes, process_of, invalid)
    plan.moves = node_moves(plan, set())
    return plan


def _read_route(line: bytes, i: int, invalid: dict[int, str],
                decode: object) -> tuple[str, str, float] | None:
    """A line's job, node and time; None for a blank line or one the contract
    refuses (then noted in ``invalid``)."""
    if not line or line.isspace():
        return None
    try:
        route = _route.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass  # not plain JSON to msgspec (NaN, say): the contract decides
    else:
        return route.job, route.node, route.ts
    try:
        sample = decode(line)  # type: ignore[operator]
    except ContractError as exc:
        invalid[i + 1] = str(exc)
        return None
    return sample["job"], sample["node"], float(sample["ts"])


def node_moves(plan: Plan, skipped: set[int]) -> list[list[Move]]:
    """Each process's node moves, in line order: what ``NodeMoves`` finds over the
    lines read, less ``skipped`` (lines found invalid)."""
    moves: list[list[Move]] = [[] for _ in range(plan.processes)]
    last: dict[int, int] = {}  # node → the job it last reported under
    for i, (j, n) in enumerate(zip(plan.job_of, plan.node_of, strict=True)):
        if j < 0 or i in skipped:
            continue
        before = last.get(n)
        if before == j:
            continue
        last[n] = j
        left = plan.jobs[before] if before is not None else ""
        if left:
            moves[plan.process_of[left]].append(Move(i, left, plan.nodes[n]))
    return moves


def replay_part(path: str, plan: Plan, me: int, cfg: DetectConfig,
                shards: int = 1) -> PartResult:
    """Replay process ``me``'s lines of the trace, applying its node moves; each job
    in one stage, or in ``shards`` stage-1 shards and a stage 2 (``vigil replay
    --shards``: the same detections)."""
    from vigil_gpu_monitor.detectors.engine import JobEngine
    from vigil_gpu_monitor.detectors.shard import ShardedJob
    from vigil_gpu_monitor.streams.decode import decode_sample_fast

    engines: dict[str, JobEngine | ShardedJob] = {}
    moves = iter(plan.moves[me])
    move = next(moves, None)
    out: list[tuple[int, bytes]] = []
    invalid: dict[int, str] = {}
    misread = False
    owner = plan.owner
    for i, line in _lines(path):
        while move is not None and move.line <= i:  # before the line that moved it
            if move.left in engines:
                engines[move.left].node_left(move.node)
            move = next(moves, None)
        if owner[i] != me:
            continue
        try:
            sample = decode_sample_fast(line)
        except ContractError as exc:
            invalid[i + 1] = str(exc)
            continue
        job = sample["job"]
        if job != plan.jobs[plan.job_of[i]] or sample["node"] != plan.nodes[plan.node_of[i]]:
            misread = True
            break
        engine = engines.get(job)
        if engine is None:
            engine = engines[job] = (JobEngine(job, cfg) if shards <= 1
                                     else ShardedJob(job, shards, cfg))
        found = (engine.ingest(sample) + engine.advance() if isinstance(engine, JobEngine)
                 else engine.feed(sample))
        for detection in found:
            out.append((i, encode_detection(detection)))
    return PartResult(out, invalid, misread, len(engines),
                      sum(e.late for e in engines.values()))


def _child(path: str, plan: Plan, me: int, cfg: DetectConfig, shards: int,
           conn: multiprocessing.connection.Connection) -> None:
    try:
        conn.send(replay_part(path, plan, me, cfg, shards))
    finally:
        conn.close()


def run_parts(path: str, plan: Plan, cfg: DetectConfig, shards: int = 1) -> list[PartResult]:
    """Every process's part, run at once (forked: each inherits the plan)."""
    ctx = multiprocessing.get_context("fork")
    children = []
    for me in range(plan.processes):
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(path, plan, me, cfg, shards, send),
                            daemon=True)
        child.start()
        send.close()
        children.append((child, receive))
    results = []
    for child, receive in children:
        try:
            results.append(receive.recv())
        except EOFError as exc:
            raise RuntimeError(f"replay process {child.pid} ended without a result") from exc
        finally:
            child.join()
    return results


class Outcome(NamedTuple):
    """What a replay over processes found, in one process's order."""

    detections: list[bytes]
    invalid: dict[int, str]  # line number → reason, every invalid line
    jobs: int
    late: int
    lines: int  # the trace's lines that were samples or invalid (blank ones not counted)


def replay_jobs(path: str, processes: int, cfg: DetectConfig,
                shards: int = 1) -> Outcome | None:
    """The trace's detections from ``processes`` processes (each job in ``shards``
    stage-1 shards and a stage 2 where more than one); None when the plan did not
    hold (a line misread, or an invalid line that moved a node), and the trace must
    be replayed in one process instead."""
    plan = make_plan(path, processes, cfg.bin_seconds)
    parts = run_parts(path, plan, cfg, shards)
    found = {line: why for part in parts for line, why in part.invalid.items()}
    if any(part.misread for part in parts) or (
            found and node_moves(plan, {line - 1 for line in found}) != plan.moves):
        return None
    detections = sorted((d for part in parts for d in part.detections), key=lambda d: d[0])
    return Outcome([d for _, d in detections], {**plan.invalid, **found},
                   sum(p.jobs for p in parts), sum(p.late for p in parts),
                   sum(1 for j in plan.job_of if j >= 0) + len(plan.invalid))
