"""``vigil.step/1``: the hand-written validator, the JSON Schema, one bad step costs one step."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from vigil_gpu_monitor.contracts import schema_gen
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.steps import (
    DroppedStep,
    decode_steps,
    encode_steps,
    validate_step_batch,
)

BATCH: dict[str, Any] = {
    "schema": "vigil.step/1", "job": "job-1", "node": "n1", "source": "witness",
    "ranks": [
        {"rank": 8, "gpu": "0", "stage": 1, "dp": 0,
         "steps": [{"step": 41, "end": 1700000000.5, "wall": 1.02, "compute": 0.81},
                   {"step": 42, "end": 1700000001.5, "wall": 1.0}]},
        {"rank": None, "steps": [{"step": 42, "end": 1700000001.5, "wall": 1.0}]},
    ],
    "meta": {"version": "1"},
}
SCHEMA = schema_gen.step_schema()


def _mutate(path: str, value: Any) -> dict[str, Any]:
    msg = copy.deepcopy(BATCH)
    *parents, leaf = path.split(".")
    target: Any = msg
    for p in parents:
        target = target[int(p)] if isinstance(target, list) else target[p]
    if value is KeyError:
        del target[leaf]
    else:
        target[leaf] = value
    return msg


def test_a_valid_batch_round_trips_and_the_schema_accepts_it() -> None:
    assert decode_steps(encode_steps(BATCH)) == BATCH  # type: ignore[arg-type]
    jsonschema.validate(BATCH, SCHEMA)


@pytest.mark.parametrize(("path", "value", "reason"), [
    ("schema", "vigil.step/2", "unknown_schema"),
    ("job", "", "bad_value"),
    ("node", KeyError, "missing_field"),
    ("ranks", [], "out_of_range"),
    ("ranks", {}, "wrong_type"),
    ("extra", 1, "unknown_field"),
    ("ranks.0.gpu", "x", "bad_value"),
    ("ranks.0.rank", -1, "out_of_range"),
    ("ranks.0.rank", "8", "wrong_type"),
    ("ranks.0.stage", 1.5, "wrong_type"),
    ("ranks.0.steps.0.wall", 0, "out_of_range"),
    ("ranks.0.steps.0.wall", 1e6, "out_of_range"),
    ("ranks.0.steps.0.step", -3, "out_of_range"),
    ("ranks.0.steps.0.end", "soon", "wrong_type"),
    ("ranks.0.steps.0.compute", -0.1, "out_of_range"),
    ("ranks.0.steps.0.bogus", 1, "unknown_field"),
    ("meta", [], "wrong_type"),
])
def test_bad_batches_refused_with_a_reason_and_the_schema_agrees(path: str, value: Any,
                                                                 reason: str) -> None:
    msg = _mutate(path, value)
    with pytest.raises(ContractError) as err:
        validate_step_batch(msg)
    assert err.value.reason == reason
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(msg, SCHEMA)


def test_compute_beyond_wall_is_refused() -> None:
    """What JSON Schema cannot say: a rank cannot compute longer than its step."""
    with pytest.raises(ContractError) as err:
        validate_step_batch(_mutate("ranks.0.steps.0.compute", 2.0))
    assert err.value.reason == "out_of_range"


def test_lenient_decoding_drops_one_bad_step_and_keeps_the_rest() -> None:
    msg = _mutate("ranks.0.steps.0.wall", float("nan"))
    raw = json.dumps(msg)  # NaN as the JSON constant a careless producer writes
    with pytest.raises(ContractError):
        decode_steps(raw)
    dropped: list[DroppedStep] = []
    batch = decode_steps(raw, dropped)
    assert [d.reason for d in dropped] == ["non_finite"] and dropped[0].step == 41
    assert [s["step"] for s in batch["ranks"][0]["steps"]] == [42]
    assert batch["ranks"][1]["steps"][0]["wall"] == 1.0


def test_encoding_refuses_what_it_would_not_accept() -> None:
    with pytest.raises(ContractError):
        encode_steps(_mutate("ranks.0.steps.0.wall", -1.0))
