"""Dead-letter records: the original bytes with the reason they were refused."""

from __future__ import annotations

import base64
import json
import time

# The original is kept whole up to this size; beyond it, the first bytes and the size
# (a dead letter must always fit the dead-letter topic, whatever came in).
MAX_ORIGINAL_BYTES = 1 << 20


def deadletter_record(raw: bytes | None, reason: str, detail: str, topic: str,
                      partition: int, offset: int) -> bytes:
    """A JSON record that keeps the original message byte for byte (base64), cut at
    ``MAX_ORIGINAL_BYTES`` with ``original_truncated`` set."""
    raw = raw or b""
    return json.dumps({
        "reason": reason,
        "detail": detail[:500],
        "source": {"topic": topic, "partition": partition, "offset": offset},
        "refused_at": time.time(),
        "original_b64": base64.b64encode(raw[:MAX_ORIGINAL_BYTES]).decode(),
        "original_bytes": len(raw),
        "original_truncated": len(raw) > MAX_ORIGINAL_BYTES,
    }, separators=(",", ":")).encode()
