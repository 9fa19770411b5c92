"""Engine state on the changelog: compact JSON (orjson), zlib-compressed (~3.7x smaller)."""

from __future__ import annotations

import zlib
from typing import Any

import orjson


def encode_state(state: dict[str, Any]) -> bytes:
    """A JSON-able engine state → compressed bytes for the table."""
    return zlib.compress(orjson.dumps(state), 1)


def decode_state(blob: bytes | None) -> dict[str, Any] | None:
    """Bytes from the table → engine state (None when the job has no checkpoint)."""
    return orjson.loads(zlib.decompress(blob)) if blob else None
