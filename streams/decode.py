"""Fast sample decoding for the worker: orjson parses, the contract validates.

``contracts`` stays standard-library only (the node agent imports it), so the
worker brings its own parser. orjson refuses NaN/Infinity like the contract does;
whatever it refuses is parsed again by the contract's parser, so the dead-letter
reason is exactly the one `contracts.codec` gives.
"""

from __future__ import annotations

import orjson

from contracts.codec import MAX_MESSAGE_BYTES, decode_sample, validate_sample
from contracts.messages import Sample


def decode_sample_fast(raw: bytes | str) -> Sample:
    """Bytes from Kafka (or a trace line) → a validated sample dict, or
    ``ContractError`` with its reason."""
    if raw is None or len(raw) > MAX_MESSAGE_BYTES:
        return decode_sample(raw or b"")
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return decode_sample(raw)  # raises with the precise reason
    return validate_sample(message)
