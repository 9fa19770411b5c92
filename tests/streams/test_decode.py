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
