"""Reading a trace file as a user hands it over: plain, gzip, xz or zstd JSON lines
(told apart by their magic bytes, not their names), or something that is no trace at
all.

A file that holds no valid sample is an error, not an empty run: a user who gives
`vigil replay` a binary file, a compressed file we cannot read or an empty file must
hear so, not read "0 jobs". Lines that fail the contract are skipped and counted; the
count and the first few reasons are told once, at the end.
"""

from __future__ import annotations

import gzip
import io
import logging
import lzma
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any

from vigil_gpu_monitor.contracts.codec import decode_trace
from vigil_gpu_monitor.contracts.errors import ContractError, VigilError

log = logging.getLogger("vigil.trace")

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
XZ_MAGIC = b"\xfd7zXZ\x00"  # the foreign traces ship so (`xz`, standard library)
SNIFF_BYTES = 4096  # enough to see binary data before reading a "line" of it
SHOWN_SKIPPED = 3  # skipped lines whose reasons the summary quotes
# a plain trace's read buffer: lines of 4-5 KB through the default 8 KB cost a
# refill every line or two (1.7-2.9 against 0.9-1.0 µs a line of base-5 read)
READ_BUFFER = 1 << 20


class TraceError(VigilError):
    """A trace that cannot be read as JSON lines of samples."""


def _binary(head: bytes) -> bool:
    """Text JSON lines hold no NUL byte and decode as UTF-8 (a cut at the sniff's end
    aside)."""
    if b"\0" in head:
        return True
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(head) - 4
    return False


def _zstd_reader(raw: IO[bytes], path: str) -> IO[bytes]:
    try:
        import zstandard
    except ModuleNotFoundError:
        raise TraceError(f"{path} is zstd-compressed and this install has no zstandard",
                         fix="pip install zstandard, or decompress it with `zstd -d`") from None
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return io.BufferedReader(reader)


@contextmanager
def open_trace(path: str) -> Iterator[IO[bytes]]:
    """The decompressed bytes of a trace (``-``: stdin), by its magic bytes."""
    raw: IO[bytes] = (sys.stdin.buffer if path == "-"
                      else open(path, "rb", buffering=READ_BUFFER))
    try:
        buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(raw)  # type: ignore[type-var]
        head = buffered.peek(SNIFF_BYTES)[:SNIFF_BYTES]
        if head.startswith(GZIP_MAGIC):
            yield gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[misc]
        elif head.startswith(ZSTD_MAGIC):
            yield _zstd_reader(buffered, path)
        elif head.startswith(XZ_MAGIC):
            yield io.BufferedReader(lzma.LZMAFile(buffered, "rb"), READ_BUFFER)
        elif _binary(head):
            raise TraceError(f"{path} is binary data, not a JSON-lines trace",
                             fix="give a vigil.sample/1 JSON-lines file (plain, .gz, .xz "
                                 "or .zst)")
        else:
            yield buffered
    finally:
        if raw is not sys.stdin.buffer:
            raw.close()


def compressed(path: str) -> bool:
    """Whether the trace at ``path`` is gzip, xz or zstd (told by its first bytes)."""
    with open(path, "rb") as raw:
        head = raw.read(len(XZ_MAGIC))
    return head.startswith((GZIP_MAGIC, ZSTD_MAGIC, XZ_MAGIC))


def skipped_summary(path: str, skipped: int, total: int, first: list[str]) -> None:
    """The one warning a trace's invalid lines get: their count and the first few."""
    log.warning("%s: %d invalid lines skipped (of %d); first: %s", path, skipped, total,
                "; ".join(first[:SHOWN_SKIPPED]))


def read_samples(path: str, decode: Callable[[bytes | str], Any] | None = None
                 ) -> Iterator[Any]:
    """The valid messages of a trace (samples, or what ``decode`` reads: a sample or
    a step batch), in file order. Skipped lines are summarised once (count, first
    few reasons) in a warning at the end; a trace with none valid is a
    ``TraceError`` naming the file and the first reason."""
    if decode is None:
        from vigil_gpu_monitor.streams.decode import (
            decode_sample_fast,  # msgspec: parse, validate at once
        )

        decode = decode_sample_fast

    skipped = 0
    first: list[str] = []

    def invalid(lineno: int, exc: ContractError) -> None:
        nonlocal skipped
        skipped += 1
        if len(first) < SHOWN_SKIPPED:
            first.append(f"line {lineno}: {str(exc)[:160]}")

    valid = 0
    try:
        with open_trace(path) as lines:
            for sample in decode_trace(lines, invalid, decode):
                valid += 1
                yield sample
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise TraceError(f"{path}: compressed data is corrupt or cut short ({exc})",
                         fix="check the file, or recompress it") from None
    except Exception as exc:
        if type(exc).__module__.startswith("zstandard"):
            raise TraceError(f"{path}: zstd data is corrupt or cut short ({exc})",
                             fix="check the file, or recompress it") from None
        raise
    if not valid:
        why = f"{skipped} invalid line(s), first {first[0]}" if first else "it is empty"
        raise TraceError(f"{path} holds no valid vigil.sample/1 line: {why}",
                         fix="give a trace written by `vigil simulate --out` or "
                         "`vigil agent --out`")
    if skipped:
        skipped_summary(path, skipped, skipped + valid, first)
