"""``vigil.summary/1``: what stage 1 sends stage 2 of a sharded job. Real summaries
(from a simulated job through the two stages) pass the validator and the JSON Schema
and survive the wire bit for bit; malformed ones are refused with a clear reason,
never with another exception."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonschema
import pytest

from vigil_gpu_monitor.contracts import schema_gen
from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import Summary
from vigil_gpu_monitor.contracts.summary import (
    NODES_PER_PART,
    decode_summary,
    encode_summary,
    split_parts,
)
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardedJob
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 1_800_000_000.0
SCHEMA = schema_gen.summary_schema()


@pytest.fixture(scope="module")
def summaries() -> list[Summary]:
    """Every summary of a 4-node job with an XID, at 2 shards."""
    names = [f"s-{i}" for i in range(4)]
    cluster = Cluster([JobSpec("sum-job", names)], [Fault("xid", "sum-job", names[2], "3",
                                                          START + 30)])
    seen: list[Summary] = []

    def keep(s: Summary) -> Summary:
        seen.append(copy.deepcopy(s))
        return s

    job = ShardedJob("sum-job", 2, DetectConfig(), keep)
    for sample in Simulator(cluster, START, seed=2).samples(60):
        job.feed(sample)
    return seen


def test_real_summaries_pass_the_validator_and_the_schema_and_survive_the_wire(
        summaries: list[Summary]) -> None:
    assert any(s["bin"] is None and s["events"] for s in summaries), "the XID's event"
    assert any(s["nodes"] for s in summaries)
    for s in summaries:
        jsonschema.validate(s, SCHEMA)
        raw = encode_summary(s)
        back = decode_summary(raw)
        assert back == json.loads(json.dumps(s))
        for node, rows in s["nodes"].items():  # means are exact, NaN kept
            assert base64.b64decode(back["nodes"][node]["gpu_means"]) == \
                base64.b64decode(rows["gpu_means"])


def _bin_summary(summaries: list[Summary]) -> Summary:
    return copy.deepcopy(next(s for s in summaries if s["nodes"] and s["health"]))


def _set(msg: Any, path: str, value: Any) -> Any:
    keys = path.split(".")
    target = msg
    for k in keys[:-1]:
        target = target[next(iter(target)) if k == "*" else k]
    last = keys[-1]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return msg


@pytest.mark.parametrize(("path", "value", "reason"), [
    ("schema", "vigil.summary/2", "unknown_schema"),
    ("shard", 2, "bad_summary"),  # not below shards
    ("shards", 0, "bad_summary"),
    ("bin", 1.5, "bad_summary"),
    ("bin_seconds", 0, "bad_summary"),
    ("late", -1, "bad_summary"),
    ("declared", "yes", "bad_summary"),
    ("gpu_metrics", ["not_a_metric"], "bad_summary"),
    ("job", "", "bad_name"),
    ("extra", 1, "unknown_field"),
    ("events", KeyError, "missing_field"),
    ("nodes.*.gpu_means", "!!!", "bad_summary"),
    ("nodes.*.gpu_means", base64.b64encode(b"\0" * 8).decode(), "bad_summary"),
    ("nodes.*.gpus", "0", "bad_summary"),
    ("health.*.cadence", [1.0], "bad_summary"),
    ("health.*.unplaced", None, "bad_summary"),
    ("health.*.gpus", [], "bad_summary"),
    ("resumed", "soon", "bad_summary"),
    ("resumed", True, "bad_summary"),
])
def test_malformed_summaries_are_refused_with_a_reason(summaries: list[Summary], path: str,
                                                       value: Any, reason: str) -> None:
    msg = _set(_bin_summary(summaries), path, value)
    raw = json.dumps(msg).encode()
    with pytest.raises(ContractError) as err:
        decode_summary(raw)
    assert err.value.reason == reason, err.value


def test_when_the_broker_came_back_travels_in_a_bin_summary(summaries: list[Summary]) -> None:
    """``resumed`` (detectors/delivery.py) is optional: a number, or null."""
    for value in (START + 12.5, None):
        msg = _bin_summary(summaries)
        msg["resumed"] = value
        jsonschema.validate(msg, SCHEMA)
        assert decode_summary(encode_summary(msg))["resumed"] == value


def test_means_are_checked_as_strictly_as_base64_decodes_them(
        summaries: list[Summary]) -> None:
    """The check does not decode the means (stage 2 decodes them once, at assembly):
    what it lets through must decode, strictly, to the rows' float64 bytes."""
    msg = _bin_summary(summaries)
    node = next(iter(msg["nodes"]))
    good = msg["nodes"][node]["gpu_means"]
    size = len(base64.b64decode(good))
    bad = [good[:-4], good + "====", good[:8] + "=" + good[9:], good[:8] + "\n" + good[9:],
           good[:8] + "é" + good[9:], good[:8] + "-" + good[9:], good.rstrip("=") + "A",
           "=" * len(good), " " + good[1:]]
    for value in bad:
        msg["nodes"][node]["gpu_means"] = value
        try:
            back = decode_summary(json.dumps(msg).encode())
        except ContractError as err:
            assert err.reason == "bad_summary"
        else:
            raw = base64.b64decode(back["nodes"][node]["gpu_means"], validate=True)
            assert len(raw) == size, value


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'{"schema": "vigil.summary/1"}',
                                 b"\xff\xfe", b'{"a": NaN}'])
def test_garbage_is_a_contract_error(raw: bytes) -> None:
    with pytest.raises(ContractError):
        decode_summary(raw)


def test_every_single_byte_corruption_is_refused_or_read_never_a_crash(
        summaries: list[Summary]) -> None:
    raw = encode_summary(_bin_summary(summaries))
    for i in range(0, len(raw), max(1, len(raw) // 300)):
        for byte in (b"}", b"x", b'"', b"9"):
            bad = raw[:i] + byte + raw[i + 1:]
            try:
                decode_summary(bad)
            except ContractError:
                pass


def test_stage_2_refuses_a_summary_of_another_job_or_layout(summaries: list[Summary]) -> None:
    stage2 = JobStage2("other-job", 2, DetectConfig())
    with pytest.raises(ContractError, match="other-job"):
        stage2.receive(_bin_summary(summaries))
    stage2 = JobStage2("sum-job", 2, DetectConfig())
    msg = _bin_summary(summaries)
    msg["gpu_metrics"] = msg["gpu_metrics"][:-1]
    with pytest.raises(ContractError, match="metrics"):
        stage2.receive(msg)
    assert not stage2.bins and not stage2.node_state  # nothing of it was used


def test_a_big_bin_is_split_in_parts_that_fit_and_add_up(summaries: list[Summary]) -> None:
    msg = _bin_summary(summaries)
    rows, health = next(iter(msg["nodes"].values())), next(iter(msg["health"].values()))
    many = 2 * NODES_PER_PART + 5
    msg["nodes"] = {f"node-{i:04d}": rows for i in range(many)}
    msg["health"] = {f"node-{i:04d}": health for i in range(many)}
    parts = list(split_parts(msg))
    assert [p["part"] for p in parts] == [0, 1, 2] and {p["parts"] for p in parts} == {3}
    decoded = [decode_summary(encode_summary(p)) for p in parts]
    assert sum(len(p["nodes"]) for p in decoded) == many
    assert set().union(*(p["health"] for p in decoded)) == set(msg["health"])
    with pytest.raises(ContractError, match="128 nodes"):
        encode_summary(msg)  # unsplit: more nodes than a part holds


def _verdict(raw: bytes) -> str:
    try:
        decode_summary(raw)
    except ContractError as err:
        return f"{err.reason}: {err}"
    return "accepted"


def test_rows_checked_at_once_get_the_verdicts_of_rows_checked_one_by_one(
        summaries: list[Summary], monkeypatch: pytest.MonkeyPatch) -> None:
    """A part's rows are checked in passes over all of them where they are alike;
    whatever that lets through or sends back to the row-by-row check, each message
    gets the row-by-row check's verdict, reason and words."""
    from vigil_gpu_monitor.contracts import summary as contract
    msg = _bin_summary(summaries)
    assert len(msg["nodes"]) >= 2
    first, second = list(msg["nodes"])[:2]
    row = msg["nodes"][first]
    assert contract._rows_at_once(list(msg["nodes"].values()), len(msg["gpu_metrics"]),
                                  len(msg["nic_metrics"])), "the usual part: checked at once"
    one_gpu = base64.b64encode(base64.b64decode(row["gpu_means"])[
        :8 * len(msg["gpu_metrics"])]).decode()
    changes: list[tuple[str, str, Any]] = [
        (first, "gpus", row["gpus"][:1]),  # fewer GPUs, means not cut: refused
        (first, "gpu_means", one_gpu),  # means of one GPU, GPUs not cut: refused
        (first, "gpus", ["x" * 257] + row["gpus"][1:]),
        (first, "gpus", [""] + row["gpus"][1:]),
        (first, "gpus", [0] + row["gpus"][1:]),
        (first, "nics", "mlx5_0"),
        (first, "nic_means", row["nic_means"][:-4]),
        (first, "nic_means", None),
        (second, "gpu_means", row["gpu_means"][:-1] + "="),
        (second, "gpu_means", row["gpu_means"].replace("A", "é", 1)),
        (second, "gpu_means", "=" + row["gpu_means"][1:]),
        (second, "extra", 1),
    ]
    raws = [json.dumps(msg).encode()]
    for node, field, value in changes:
        changed = copy.deepcopy(msg)
        changed["nodes"][node][field] = value
        raws.append(json.dumps(changed).encode())
    both = copy.deepcopy(msg)  # a node of one GPU whose means say so: accepted
    both["nodes"][first]["gpus"] = row["gpus"][:1]
    both["nodes"][first]["gpu_means"] = one_gpu
    raws.append(json.dumps(both).encode())
    fast = [_verdict(raw) for raw in raws]
    monkeypatch.setattr(contract, "_rows_at_once", lambda *_: False)
    assert fast == [_verdict(raw) for raw in raws]
    assert fast[0] == fast[-1] == "accepted"
    assert all(v != "accepted" for v in fast[1:-1])
