"""Engine state on the changelog: compact JSON, zlib-compressed (about 3.7x smaller)."""

from __future__ import annotations

import json
import zlib
from typing import Any


def encode_state(state: dict[str, Any]) -> bytes:
    """A JSON-able engine state → compressed bytes for the table."""
    return zlib.compress(json.dumps(state, separators=(",", ":")).encode(), 1)


def decode_state(blob: bytes | None) -> dict[str, Any] | None:
    """Bytes from the table → engine state (None when the job has no checkpoint)."""
    return json.loads(zlib.decompress(blob)) if blob else None
