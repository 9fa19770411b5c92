"""Engine state on the changelog: compact JSON (orjson), compressed with Zstandard.

Zstandard at level 1 makes a checkpoint ~2.5x smaller than its JSON and a little
smaller than zlib at its fastest level, in a fifth of zlib's time: compressing took
most of a checkpoint's cost, and checkpoints 8 % of the worker's time
(bench/RESULTS.md, "Checkpoints"). Checkpoints written by earlier versions are zlib;
they are told apart by their first bytes and still read.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson
import zstandard

ZSTD_LEVEL = 1
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # every Zstandard frame begins with these bytes
_compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
_decompressor = zstandard.ZstdDecompressor()


def encode_state(state: dict[str, Any]) -> bytes:
    """A JSON-able engine state → compressed bytes for the table."""
    return _compressor.compress(orjson.dumps(state))


def decode_state(blob: bytes | None) -> dict[str, Any] | None:
    """Bytes from the table → engine state (None when the job has no checkpoint)."""
    if not blob:
        return None
    if blob.startswith(_ZSTD_MAGIC):
        return orjson.loads(_decompressor.decompress(blob))
    return orjson.loads(zlib.decompress(blob))  # written before Zstandard
