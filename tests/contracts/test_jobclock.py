"""``vigil.jobclock/1`` (stage 2 back to a sharded job's stage 1) and a summary's
``clocks``: real messages pass the validator and the JSON Schema and survive the
wire; malformed ones are refused with a clear reason, never another exception."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from vigil_gpu_monitor.contracts import schema_gen, topics
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.jobclock import decode_jobclock, encode_jobclock
from vigil_gpu_monitor.contracts.messages import JobClock, Summary
from vigil_gpu_monitor.contracts.shards import shard_of
from vigil_gpu_monitor.contracts.summary import (
    decode_summary,
    encode_summary,
    split_parts,
    summary_header,
)
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardEngine
from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator

START = 1_800_000_000.0
SCHEMA = schema_gen.jobclock_schema()
SUMMARY_SCHEMA = schema_gen.summary_schema()


@pytest.fixture(scope="module")
def exchanged() -> tuple[list[Summary], list[JobClock]]:
    """Every bin summary and job clock of a 6-node job in 2 shards."""
    names = [f"c-{i}" for i in range(6)]
    cfg = DetectConfig()
    shards = {k: ShardEngine("cj", k, 2, cfg) for k in range(2)}
    stage2 = JobStage2("cj", 2, cfg)
    summaries: list[Summary] = []
    clocks: list[JobClock] = []
    for sample in Simulator(Cluster([JobSpec("cj", names)], [], skew_seconds=3.0), START,
                            seed=2).samples(60):
        shard = shards[shard_of(sample["node"], 2)]
        for s in shard.ingest(sample) + shard.seal_closed():
            if s["bin"] is not None:
                summaries.append(copy.deepcopy(s))
            stage2.receive(s)
            stage2.evaluate_ready()
            clock = stage2.jobclock_due()
            if clock is not None:
                clocks.append(clock)
                for engine in shards.values():
                    engine.take_jobclock(clock)
    return summaries, clocks


def test_real_job_clocks_and_summary_clocks_pass_the_validator_and_the_schema(
        exchanged: tuple[list[Summary], list[JobClock]]) -> None:
    summaries, clocks = exchanged
    assert clocks and all(c["reference"] is not None for c in clocks[2:])
    for c in clocks:
        jsonschema.validate(c, SCHEMA)
        assert decode_jobclock(encode_jobclock(c)) == c
    assert all("clocks" in s for s in summaries)
    for s in summaries:
        jsonschema.validate(summary_header(s), SUMMARY_SCHEMA)
        assert decode_summary(encode_summary(s)) == s
    old = {k: v for k, v in summaries[0].items() if k != "clocks"}  # before the feedback
    assert decode_summary(encode_summary(old)) == old  # type: ignore[arg-type]


def test_a_summarys_clocks_are_split_with_its_nodes() -> None:
    s: Any = {"schema": "vigil.summary/2", "job": "j", "shard": 0, "shards": 2, "bin": 1,
              "next_bin": 2, "part": 0, "parts": 1, "bin_seconds": 5.0, "max_ts": 10.0,
              "next_data_bin": None, "late": 0, "declared": None, "gpu_metrics": [],
              "nic_metrics": [], "nodes": {}, "health": {}, "events": [],
              "clocks": {f"n-{i:03d}": [float(i), None] for i in range(300)}}
    parts = list(split_parts(s))
    assert len(parts) == 3
    assert sum(len(p["clocks"]) for p in parts) == 300
    for p in parts:
        assert decode_summary(encode_summary(p)) == p


@pytest.mark.parametrize(("path", "value", "reason"), [
    ("schema", "vigil.jobclock/2", "unknown_schema"),
    ("extra", 1, "unknown_field"),
    ("voters", KeyError, "missing_field"),
    ("job", "", "bad_name"),
    ("shards", 0, "bad_jobclock"),
    ("shards", True, "bad_jobclock"),
    ("at", [1.0], "bad_jobclock"),
    ("at", "x", "bad_jobclock"),
    ("bin", 1.5, "bad_jobclock"),
    ("clock", "now", "bad_jobclock"),
    ("max_ts", float("nan"), "bad_jobclock"),
    ("bin_seconds", 0, "bad_jobclock"),
    ("next_bin", 1.5, "bad_jobclock"),
    ("voters", -1, "bad_jobclock"),
])
def test_a_malformed_job_clock_is_refused_with_its_reason(
        exchanged: tuple[list[Summary], list[JobClock]], path: str, value: Any,
        reason: str) -> None:
    msg: Any = copy.deepcopy(exchanged[1][-1])
    if value is KeyError:
        del msg[path]
    else:
        msg[path] = value
    with pytest.raises(ContractError) as err:
        encode_jobclock(msg)
    assert err.value.reason == reason


@pytest.mark.parametrize("clocks", [[], {"n": [1.0]}, {"n": ["a", None]},
                                    {"n": [1.0, float("inf")]}, {"bad name!": [1.0, None]}])
def test_a_summary_with_malformed_clocks_is_refused(
        exchanged: tuple[list[Summary], list[JobClock]], clocks: Any) -> None:
    msg: Any = copy.deepcopy(exchanged[0][-1])
    msg["clocks"] = clocks
    with pytest.raises(ContractError) as err:
        encode_summary(msg)
    assert err.value.reason in ("bad_summary", "bad_name")


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'{"schema": "vigil.jobclock/1"}'])
def test_garbage_is_refused_not_crashed_on(raw: bytes) -> None:
    with pytest.raises(ContractError):
        decode_jobclock(raw)


def test_the_topic_is_named_and_its_schema_committed() -> None:
    assert topics.JOBCLOCK == "vigil.jobclock"
    assert "jobclock-1.json" in schema_gen.rendered()
