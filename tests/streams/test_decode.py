"""The worker's fast decoder gives the contract's answers, reason for reason."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.codec import ContractError, decode_sample
from streams.decode import decode_sample_fast
from tests.contracts.test_codec import BAD_SAMPLES, SAMPLE, _mutate

RAW_CASES = [b'{"schema": ', b'{"ts": NaN}', b'{"ts": -Infinity}', b"\xff\xfe", b"[]",
             b"[" * 100000 + b"]" * 100000, b" " * (600 << 10), b'"text"', b"",
             json.dumps(SAMPLE).encode()]


def _outcome(decoder: object, raw: bytes) -> object:
    try:
        return decoder(raw)  # type: ignore[operator]
    except ContractError as exc:
        return ("error", exc.reason)


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
