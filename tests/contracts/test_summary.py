"""``vigil.summary/2``: what stage 1 sends stage 2 of a sharded job (a JSON header, a
newline, the nodes' means as float64), and ``/1`` (one JSON document, the means as
base64), which stage 2 still reads. Real summaries (from a simulated job through the
two stages) pass the validator and the header's JSON Schema and survive the wire bit
for bit, in either form; malformed ones are refused with a clear reason, never with
another exception."""

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
    summary_header,
    validate_summary,
)
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardedJob
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator

START = 1_800_000_000.0
SCHEMA = schema_gen.summary_schema()
SCHEMA_V1 = schema_gen.summary_schema(1)


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
        jsonschema.validate(summary_header(s), SCHEMA)
        raw = encode_summary(s)
        assert raw.count(b"\n") >= 1 and b"\n" not in raw[:raw.index(b"\n")]
        back = decode_summary(raw)
        assert back == s  # means exact to the byte, NaN kept
        jsonschema.validate(json.loads(_v1(s)), SCHEMA_V1)
        assert decode_summary(_v1(s)) == s  # /1, as a stage 1 not yet upgraded sends it


def test_a_node_without_nics_and_a_part_without_nodes_travel(summaries: list[Summary]) -> None:
    msg = _bin_summary(summaries)
    node = next(iter(msg["nodes"]))
    msg["nodes"][node]["nics"], msg["nodes"][node]["nic_means"] = [], b""
    assert decode_summary(encode_summary(msg)) == msg
    msg["nodes"], msg["health"] = {}, {}
    raw = encode_summary(msg)
    assert raw.endswith(b"\n") and decode_summary(raw) == msg


def _v1(msg: Any) -> bytes:
    """The summary as ``vigil.summary/1`` carried it: means (where bytes) as base64."""
    doc = copy.deepcopy(msg)
    if doc.get("schema") == "vigil.summary/2":
        doc["schema"] = "vigil.summary/1"
    for row in doc.get("nodes", {}).values():
        for key in ("gpu_means", "nic_means"):
            if isinstance(row.get(key), bytes):
                row[key] = base64.b64encode(row[key]).decode()
    return json.dumps(doc).encode()


def _v2(msg: Any) -> bytes:
    """The summary as ``/2`` carries it, written by hand (no validation): the header,
    a newline, the nodes' means (where bytes) in order."""
    header = copy.deepcopy(msg)
    block = b""
    for row in header.get("nodes", {}).values():
        for key in ("gpu_means", "nic_means"):
            value = row.pop(key, None)
            block += value if isinstance(value, bytes) else b""
    return json.dumps(header).encode() + b"\n" + block


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
    ("schema", "vigil.summary/3", "unknown_schema"),
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
    ("nodes.*.gpu_means", b"\0" * 8, "bad_summary"),
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
    for raw in (_v1(msg), _v2(msg)):
        with pytest.raises(ContractError) as err:
            decode_summary(raw)
        assert err.value.reason == reason, err.value
    with pytest.raises(ContractError):
        encode_summary(msg)


def test_a_block_that_is_not_what_the_header_lists_is_refused(
        summaries: list[Summary]) -> None:
    raw = encode_summary(_bin_summary(summaries))
    for bad in (raw[:-8], raw + b"\0" * 8, raw[:-1], raw.replace(b"\n", b"", 1),
                raw.replace(b'"vigil.summary/2"', b'"vigil.summary/1"', 1)):
        with pytest.raises(ContractError) as err:
            decode_summary(bad)
        assert err.value.reason in ("bad_summary", "invalid_json", "unknown_schema"), err.value
    header, block = raw.split(b"\n", 1)
    doc = json.loads(header)
    node = next(iter(doc["nodes"]))
    doc["nodes"][node]["gpu_means"] = "AAAA"  # means in the header as well: refused
    with pytest.raises(ContractError, match="exactly the fields"):
        decode_summary(json.dumps(doc).encode() + b"\n" + block)


def test_when_the_broker_came_back_travels_in_a_bin_summary(summaries: list[Summary]) -> None:
    """``resumed`` (detectors/delivery.py) is optional: a number, or null."""
    for value in (START + 12.5, None):
        msg = _bin_summary(summaries)
        msg["resumed"] = value
        jsonschema.validate(summary_header(msg), SCHEMA)
        assert decode_summary(encode_summary(msg))["resumed"] == value


def test_v1_means_are_checked_as_strictly_as_base64_decodes_them(
        summaries: list[Summary]) -> None:
    """``/1``'s means are checked before they are decoded: what the check lets
    through must decode, strictly, to the rows' float64 bytes."""
    msg = json.loads(_v1(_bin_summary(summaries)))
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
            assert back["nodes"][node]["gpu_means"] == base64.b64decode(value, validate=True)
            assert len(back["nodes"][node]["gpu_means"]) == size, value


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'{"schema": "vigil.summary/1"}',
                                 b"\xff\xfe", b'{"a": NaN}', b"\n", b"{}\n",
                                 b'{"schema": "vigil.summary/2"}\n\0',
                                 b'{"schema": "vigil.summary/2", "nodes": {"n": []}}\n'])
def test_garbage_is_a_contract_error(raw: bytes) -> None:
    with pytest.raises(ContractError):
        decode_summary(raw)


@pytest.mark.parametrize("form", ["/2", "/1"])
def test_every_single_byte_corruption_is_refused_or_read_never_a_crash(
        summaries: list[Summary], form: str) -> None:
    msg = _bin_summary(summaries)
    raw = encode_summary(msg) if form == "/2" else _v1(msg)
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


def _verdict(raw: bytes, check: Any = decode_summary) -> str:
    """What ``check`` says of ``raw``: accepted, or the refusal's reason and words."""
    try:
        check(raw)
    except ContractError as err:
        return f"{err.reason}: {err}"
    return "accepted"


def test_rows_checked_at_once_get_the_verdicts_of_rows_checked_one_by_one(
        summaries: list[Summary], monkeypatch: pytest.MonkeyPatch) -> None:
    """A part's rows are checked in passes over all of them where they are alike;
    whatever that lets through or sends back to the row-by-row check, each message
    gets the row-by-row check's verdict, reason and words."""
    from vigil_gpu_monitor.contracts import summary as contract
    msg = json.loads(_v1(_bin_summary(summaries)))  # /1's base64 rows
    assert len(msg["nodes"]) >= 2
    first, second = list(msg["nodes"])[:2]
    row = msg["nodes"][first]
    assert contract._rows_at_once(list(msg["nodes"].values()), len(msg["gpu_metrics"]),
                                  len(msg["nic_metrics"]), True), "the usual part: at once"
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


def test_byte_rows_checked_at_once_get_the_verdicts_of_rows_checked_one_by_one(
        summaries: list[Summary], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same for ``/2``'s rows as held in memory (means as bytes)."""
    from vigil_gpu_monitor.contracts import summary as contract
    msg = _bin_summary(summaries)
    first, second = list(msg["nodes"])[:2]
    row = msg["nodes"][first]
    assert contract._rows_at_once(list(msg["nodes"].values()), len(msg["gpu_metrics"]),
                                  len(msg["nic_metrics"]), False), "the usual part: at once"
    one_gpu = row["gpu_means"][:8 * len(msg["gpu_metrics"])]
    changes: list[tuple[str, str, Any]] = [
        (first, "gpus", row["gpus"][:1]), (first, "gpu_means", one_gpu),
        (first, "gpus", [0] + row["gpus"][1:]), (first, "nic_means", row["nic_means"][:-8]),
        (first, "nic_means", None), (second, "gpu_means", row["gpu_means"] + b"\0"),
        (second, "gpu_means", base64.b64encode(row["gpu_means"]).decode()),
        (second, "gpu_means", bytearray(row["gpu_means"])), (second, "extra", 1)]
    variants = [msg]
    for node, field, value in changes:
        changed = copy.deepcopy(msg)
        changed["nodes"][node][field] = value
        variants.append(changed)
    both = copy.deepcopy(msg)
    both["nodes"][first].update(gpus=row["gpus"][:1], gpu_means=one_gpu)
    variants.append(both)
    fast = [_verdict(v, validate_summary) for v in variants]
    monkeypatch.setattr(contract, "_rows_at_once", lambda *_: False)
    assert fast == [_verdict(v, validate_summary) for v in variants]
    assert fast[0] == fast[-1] == "accepted"
    assert all(v != "accepted" for v in fast[1:-1])
