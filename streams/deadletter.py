"""Dead-letter records: the original bytes with the reason they were refused."""

from __future__ import annotations

import base64
import json
import time


def deadletter_record(raw: bytes | None, reason: str, detail: str, topic: str,
                      partition: int, offset: int) -> bytes:
    """A JSON record that keeps the original message byte for byte (base64)."""
    return json.dumps({
        "reason": reason,
        "detail": detail[:500],
        "source": {"topic": topic, "partition": partition, "offset": offset},
        "refused_at": time.time(),
        "original_b64": base64.b64encode(raw or b"").decode(),
    }, separators=(",", ":")).encode()
