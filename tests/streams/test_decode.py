"""The worker's fast decoder gives the contract's lenient answers, reason for reason:
the same sample, the same readings dropped, the same refusal."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.contracts.test_codec import BAD_SAMPLES, SAMPLE, _mutate
from vigil_gpu_monitor.contracts.codec import (
    ContractError,
    DroppedReading,
    decode_sample,
    parse_json,
)
from vigil_gpu_monitor.streams.decode import decode_sample_fast, parse_json_fast

RAW_CASES = [b'{"schema": ', b'{"ts": NaN}', b'{"ts": -Infinity}', b"\xff\xfe", b"[]",
             b"[" * 100000 + b"]" * 100000, b" " * (600 << 10), b'"text"', b"",
             json.dumps(SAMPLE).encode()]


def _outcome(decoder: object, raw: bytes) -> object:
    dropped: list[DroppedReading] = []
    try:
        return decoder(raw, dropped), sorted(dropped)  # type: ignore[operator]
    except ContractError as exc:
        return ("error", exc.reason)


def test_one_bad_reading_is_dropped_not_the_sample() -> None:
    gpus = {"0": {"power": 140737488355328.0, "temperature": 51},
            "1": {"sm_active": 7.5, "ecc_sbe": -1, "power": 300}}
    raw = json.dumps({**SAMPLE, "gpus": gpus}).encode().replace(b"51", b"NaN")
    dropped: list[DroppedReading] = []
    sample = decode_sample_fast(raw, dropped)
    assert sample["gpus"] == {"0": {}, "1": {"power": 300}}
    assert sorted((d.device, d.metric, d.reason) for d in dropped) == [
        ("gpus.0", "power", "out_of_range"), ("gpus.0", "temperature", "non_finite"),
        ("gpus.1", "ecc_sbe", "out_of_range"), ("gpus.1", "sm_active", "out_of_range")]
    with pytest.raises(ContractError) as err:  # the strict contract refuses it whole
        decode_sample(raw)
    assert err.value.reason == "non_finite"


@pytest.mark.parametrize("raw", RAW_CASES + [json.dumps(_mutate(SAMPLE, p, v)).encode()
                                             for p, v, _ in BAD_SAMPLES])
def test_same_result_as_the_contract(raw: bytes) -> None:
    assert _outcome(decode_sample_fast, raw) == _outcome(decode_sample, raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_same_result_on_random_bytes(raw: bytes) -> None:
    assert _outcome(decode_sample_fast, raw) == _outcome(decode_sample, raw)


_ANY_VALUE = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 1100), max_value=2 ** 1100)
              | st.floats(allow_nan=False) | st.text(max_size=4)
              | st.sampled_from([1.0 + 1e-7, 1.0 + 1e-5, 2 ** 1023, 1e308, 5e-324]))
_PATHS = st.sampled_from(["ts", "job", "node", "schema", "meta", "host.cpu_util", "host.bogus",
                          "gpus.0.sm_active", "gpus.0.power", "gpus.0.xid", "gpus.0.temperature",
                          "gpus.1.sm_clock", "gpus.0.bogus", "nics.mlx5_0.ib_tx",
                          "nics.mlx5_0.ib_rate", "gpus.1", "nics.mlx5_0", "gpus", "nics",
                          "host", "extra"])
_KEYS = st.sampled_from(["0", "07", "123", "1234", "-1", "1\n", "٣", " 1", "", "x" * 257,
                         "mlx5_1", "x" * 256])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_PATHS, _ANY_VALUE | st.dictionaries(st.text(max_size=3), _ANY_VALUE,
                                                                 max_size=2)), max_size=3),
       st.lists(st.tuples(st.sampled_from(["gpus", "nics"]), _KEYS), max_size=2))
def test_same_result_on_samples_wrong_in_any_field(changes: list[tuple[str, object]],
                                                   devices: list[tuple[str, str]]) -> None:
    """Near-valid samples, wrong in a typed field or a device key: msgspec's checks
    never accept what the contract refuses, and refusals carry the contract's reason."""
    message = SAMPLE
    for path, value in changes:
        parent = message
        for step in path.split(".")[:-1]:
            parent = parent.get(step) if isinstance(parent, dict) else None
        if isinstance(parent, dict):  # a change below a field already replaced: skipped
            message = _mutate(message, path, value)
    for section, key in devices:
        if isinstance(message.get(section), dict):
            message = _mutate(message, section, {**message[section], key: {}})
    raw = json.dumps(message).encode()
    assert _outcome(decode_sample_fast, raw) == _outcome(decode_sample, raw)


@pytest.mark.parametrize("raw", [
    b'{"a": [1, 2.5, "x", null, true]}', b'"\\ud800"', b'{"a": NaN}', b'{"a": Infinity}',
    b'{"a": 1e400}', b"{", b"", b"[1,]",
    '{"a": "é"}'.encode("utf-16"), b'{"a": 1, "a": 2}', b"\xff\xfe", b"[" * 5000 + b"]" * 5000])
def test_the_fast_parser_accepts_and_refuses_as_the_contracts_does(raw: bytes) -> None:
    """Stage 2 parses summaries with orjson: what it accepts, and each refusal's
    reason, must be the contract parser's."""
    def verdict(parse: Any) -> Any:
        try:
            return ("ok", parse(raw))
        except ContractError as exc:
            return ("refused", exc.reason)
    assert verdict(parse_json_fast) == verdict(parse_json)


def test_an_integer_beyond_64_bits_is_read_as_its_nearest_float() -> None:
    """orjson's one difference: such an integer comes out a float (the summary's
    validator refuses a float wherever it reads an integer)."""
    raw = b'{"a": 123456789012345678901234567890}'
    assert parse_json_fast(raw) == {"a": float(parse_json(raw)["a"])}
