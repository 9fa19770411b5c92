"""The hand-written validator against CONTRACT.md and against the JSON Schema files."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from vigil_gpu_monitor.contracts import schema_gen
from vigil_gpu_monitor.contracts.catalog import (
    CATALOG,
    GPU_METRICS,
    HOST_METRICS,
    NIC_METRICS,
    Scope,
)
from vigil_gpu_monitor.contracts.codec import (
    ContractError,
    decode_detection,
    decode_sample,
    decode_trace,
    encode_detection,
    encode_sample,
    validate_detection,
    validate_sample,
)

SAMPLE: dict[str, Any] = {
    "schema": "vigil.sample/1", "ts": 1700000000.5, "job": "job-1", "node": "n1",
    "gpus": {"0": {"sm_active": 0.5, "power": 300.0, "xid": 0}, "1": {}},
    "host": {"cpu_util": 0.2}, "nics": {"mlx5_0": {"ib_tx": 1e9}}, "meta": {"agent": "x"},
}
DETECTION: dict[str, Any] = {
    "schema": "vigil.detection/1", "id": "straggler-1", "kind": "straggler", "state": "firing",
    "severity": "warning", "job": "job-1", "node": "n1", "gpu": "0", "started_at": 1.0,
    "detected_at": 2.0, "metrics": ["sm_active"], "score": 5.0, "summary": "s", "evidence": {},
}
SCHEMAS = {"sample": schema_gen.sample_schema(), "detection": schema_gen.detection_schema()}


def _mutate(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    msg = copy.deepcopy(base)
    *parents, leaf = path.split(".")
    target = msg
    for p in parents:
        target = target[p]
    if value is KeyError:
        del target[leaf]
    else:
        target[leaf] = value
    return msg


BAD_SAMPLES = [
    ("schema", "vigil.sample/2", "unknown_schema"),
    ("ts", "now", "wrong_type"),
    ("ts", True, "wrong_type"),
    ("ts", -5, "out_of_range"),
    ("node", "", "bad_name"),
    ("node", KeyError, "missing_field"),
    ("extra", 1, "unknown_field"),
    ("gpus.0.sm_active", 1.5, "out_of_range"),
    ("gpus.0.power", -1, "out_of_range"),
    ("gpus.0.bogus", 1, "unknown_metric"),
    ("gpus.0.sm_active", "0.5", "wrong_type"),
    ("gpus.x", {}, "bad_value"),
    ("host.gpu_util", 0.1, "unknown_metric"),
    ("nics.mlx5_0.ib_rate", 1e9, "out_of_range"),
    ("meta", [], "wrong_type"),
    ("job", "j" * 300, "bad_name"),
]


def test_valid_messages_round_trip() -> None:
    assert decode_sample(encode_sample(SAMPLE)) == SAMPLE
    assert decode_detection(encode_detection(DETECTION)) == DETECTION
    jsonschema.validate(SAMPLE, SCHEMAS["sample"])
    jsonschema.validate(DETECTION, SCHEMAS["detection"])


@pytest.mark.parametrize(("path", "value", "reason"), BAD_SAMPLES)
def test_bad_samples_rejected_with_reason_and_schema_agrees(path: str, value: Any,
                                                            reason: str) -> None:
    msg = _mutate(SAMPLE, path, value)
    with pytest.raises(ContractError) as err:
        validate_sample(msg)
    assert err.value.reason == reason
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(msg, SCHEMAS["sample"])


@pytest.mark.parametrize(("path", "value"), [
    ("kind", "meltdown"), ("state", "open"), ("severity", "page"), ("node", 3),
    ("metrics", "sm_active"), ("score", None), ("evidence", []), ("id", ""),
    ("gpu", KeyError)])
def test_bad_detections_rejected_and_schema_agrees(path: str, value: Any) -> None:
    msg = _mutate(DETECTION, path, value)
    with pytest.raises(ContractError):
        validate_detection(msg)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(msg, SCHEMAS["detection"])


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"schema": ', "invalid_json"),
    (b'{"ts": NaN}', "non_finite"),
    (b'{"ts": Infinity}', "non_finite"),
    (b"\xff\xfe", "invalid_json"),
    (b"[" * 100000 + b"]" * 100000, "invalid_json"),
    (b" " * (2 << 20), "too_large"),
    (b"[]", "wrong_type"),
])
def test_undecodable_bytes_give_clear_errors(raw: bytes, reason: str) -> None:
    with pytest.raises(ContractError) as err:
        decode_sample(raw)
    assert err.value.reason == reason


def test_nulls_are_not_readings() -> None:
    """Absence is 'no reading'; null is not a number and must not sneak in as zero."""
    with pytest.raises(ContractError):
        validate_sample(_mutate(SAMPLE, "gpus.0.sm_active", None))


def test_committed_schema_files_match_the_catalog() -> None:
    for name, text in schema_gen.rendered().items():
        committed = (schema_gen.SCHEMA_DIR / name).read_text(encoding="utf-8")
        assert committed == text, (
            f"{name} is stale: run python -m vigil_gpu_monitor.contracts.schema_gen")


def test_catalog_is_consistent() -> None:
    names = [(m.scope, m.name) for m in CATALOG]
    assert len(names) == len(set(names)), "a metric is defined twice in one scope"
    assert set(GPU_METRICS) | set(HOST_METRICS) | set(NIC_METRICS) == {m.name for m in CATALOG}
    for m in CATALOG:
        assert m.high > 0 and m.description and m.unit
        assert m.scope in (Scope.GPU, Scope.HOST, Scope.NIC)
        if m.unit == "ratio":
            assert m.high == 1.0
    schema_gpu = SCHEMAS["sample"]["properties"]["gpus"]["additionalProperties"]["properties"]
    assert set(schema_gpu) == set(GPU_METRICS)
    json.dumps(SCHEMAS)  # serialisable


def test_a_trace_skips_blank_lines_and_reports_bad_ones_by_their_number() -> None:
    good = encode_sample(SAMPLE)  # type: ignore[arg-type]
    bad: list[int] = []
    lines: list[bytes | str] = [good + b"\n", b"\n", b" \t\r\n", b"", b"{not json\n",
                                good.decode() + "\n", "  \n"]
    found = list(decode_trace(lines, lambda lineno, _exc: bad.append(lineno)))
    assert len(found) == 2 and bad == [5]



def test_drop_bad_readings_takes_out_only_the_bad_ones() -> None:
    from vigil_gpu_monitor.contracts.codec import drop_bad_readings

    sample = copy.deepcopy(SAMPLE)
    sample["gpus"]["0"].update(power=float("nan"), temperature=1e9, ecc_sbe="3")
    sample["host"]["cpu_util"] = 2.0
    sample["nics"]["mlx5_0"]["ib_rate"] = -1
    sample["gpus"]["1"]["bogus"] = 1  # unknown names are the message's fault, kept
    dropped = drop_bad_readings(sample)
    assert sorted((d.device, d.metric, d.reason) for d in dropped) == [
        ("gpus.0", "ecc_sbe", "wrong_type"), ("gpus.0", "power", "non_finite"),
        ("gpus.0", "temperature", "out_of_range"), ("host", "cpu_util", "out_of_range"),
        ("nics.mlx5_0", "ib_rate", "out_of_range")]
    assert sample["gpus"]["0"] == {"sm_active": 0.5, "xid": 0} and sample["host"] == {}
    with pytest.raises(ContractError) as err:
        validate_sample(sample)
    assert err.value.reason == "unknown_metric"
    assert drop_bad_readings(copy.deepcopy(SAMPLE)) == [] and drop_bad_readings([1]) == []
