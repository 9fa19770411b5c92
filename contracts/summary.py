"""Encode and decode ``vigil.summary/2``, the message from stage 1 to stage 2 of a
sharded job (docs/contract.md, docs/sharding.md).

A summary carries one shard's sealed bin: per node, the bin's means as float64
(exact, NaN kept: stage 2 assembles the bit-identical sealed window one stage
holds), each node's health bookkeeping, and the health findings that fired on
samples since the shard's last summary. A bin of many nodes is split into parts of
at most ``NODES_PER_PART`` nodes, each part under the contract's message size.

**On the wire** (``/2``) a part is a compact JSON header (every field, each node's
rows naming its devices only), a newline, then one block of the nodes' means:
little-endian float64, the header's nodes in order, each node's GPUs then its NICs,
devices × metrics. In memory a node's means are those bytes (``NodeRows``). ``/1``
carried them as base64 text inside one JSON document: at 16,384 nodes stage 2 spent
~130 ms a bin parsing, checking and decoding that text (bench/RESULTS.md); ``/1`` is
still read, so stage 2 can be upgraded before stage 1.

The validator is hand-written on the standard library, like the others; a summary
that fails it raises ``ContractError`` (counted and dead-lettered by stage 2, never a
crash).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterator
from itertools import chain, repeat
from operator import eq, itemgetter
from typing import Any, cast

from vigil_gpu_monitor.contracts import SUMMARY_SCHEMA, SUMMARY_SCHEMA_V1
from vigil_gpu_monitor.contracts.catalog import GPU_METRICS, NIC_METRICS
from vigil_gpu_monitor.contracts.codec import (
    DETECTION_KINDS,
    MAX_GPUS,
    MAX_MESSAGE_BYTES,
    MAX_NICS,
    SEVERITIES,
    parse_json,
)
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.jobclock import validate_clocks
from vigil_gpu_monitor.contracts.messages import NodeHealth, NodeRows, Summary, SummaryEvent
from vigil_gpu_monitor.contracts.names import job_problem, node_problem
from vigil_gpu_monitor.contracts.shards import MAX_SHARDS

NODES_PER_PART = 128  # ~2.3 KB a node of 8 GPUs and 8 NICs: ~300 KB a part
MAX_PARTS = 1024
MAX_BIN = 2 ** 53
_FIELDS = {"schema", "job", "shard", "shards", "bin", "next_bin", "part", "parts", "bin_seconds",
           "max_ts", "next_data_bin", "late", "declared", "gpu_metrics", "nic_metrics",
           "nodes", "health", "events"}
# each node's clock (issue #46's job-clock feedback); when the shard's samples that
# waited for the broker got through (detectors/delivery.py)
_OPTIONAL = {"clocks", "resumed"}
_ROW_FIELDS = {"gpus", "gpu_means", "nics", "nic_means"}
_HEADER_ROW_FIELDS = {"gpus", "nics"}  # ``/2``'s header: the means are in the block
_HEALTH_FIELDS = {"last", "cadence", "unplaced", "gpus"}
_EVENT_FIELDS = {"ts", "kind", "node", "gpu", "severity", "metrics", "score", "summary",
                 "since", "evidence", "fire_after"}


def _bad(path: str | tuple[str, ...], what: str) -> ContractError:
    """The error of a field; ``path`` as its parts, joined only here (building each
    node's paths cost stage 2 a tenth of its decoding)."""
    where = path if isinstance(path, str) else ".".join(path)
    return ContractError("bad_summary", f"{where} {what}")


def _int(value: Any, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(path, f"must be an integer {low}..{high}")
    return value


def _num(value: Any, path: str, *, null_ok: bool = False) -> float | None:
    if value is None and null_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value \
            or value in (float("inf"), float("-inf")):
        raise _bad(path, "must be a finite number")
    return float(value)


def _strings(value: Any, path: str | tuple[str, ...], limit: int) -> list[str]:
    # each check a pass in C (a generator's step per name was a fifth of stage 2's
    # decoding at 16,384 nodes)
    if not isinstance(value, list) or len(value) > limit or value and (
            set(map(type, value)) != {str} or not 0 < min(map(len, value))
            or max(map(len, value)) > 256):
        raise _bad(path, f"must be a list of at most {limit} names")
    return value


def _obj(value: Any, path: str | tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(path, "must be an object")
    return value


# base64's alphabet (``=`` padding apart)
_B64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _is_base64(value: str) -> bool:
    """Only base64's alphabet, then at most two ``=``: the alphabet deleted from the
    bytes in C leaves only the padding (0.8 µs a node's 1,280 characters, where a
    compiled pattern took 3.0 µs and stripping the alphabet more)."""
    try:
        rest = value.encode("ascii").translate(None, _B64_ALPHABET)
    except UnicodeEncodeError:
        return False
    return not rest or (len(rest) <= 2 and rest.count(b"=") == len(rest)
                        and value.endswith("=" * len(rest)))


def _means(value: Any, path: str | tuple[str, ...], rows: int, width: int,
           text: bool) -> None:
    size = rows * width * 8
    if not text:  # ``/2``: the bytes themselves
        if type(value) is not bytes or len(value) != size:
            raise _bad(path, f"must be {size} bytes: {rows} devices x {width} metrics x 8 "
                             "(float64)")
        return
    # ``/1``, checked without decoding it (``_from_v1`` decodes it once): only the
    # alphabet, ``=`` padding at the end, whole quanta, and the length that
    # ``rows x width`` float64 take; what ``b64decode(validate=True)`` accepts
    if not isinstance(value, str):
        raise _bad(path, "must be base64 text")
    if len(value) % 4 or not _is_base64(value):
        raise _bad(path, "is not base64")
    held = len(value) // 4 * 3 - (len(value) - len(value.rstrip("=")))
    if held != size:
        raise _bad(path, f"holds {held} bytes, not {rows} devices x {width} metrics "
                         "x 8 (float64)")


def _rows(node: str, value: Any, gpu_width: int, nic_width: int, text: bool) -> None:
    row = _obj(value, ("nodes", node))
    if row.keys() != _ROW_FIELDS:
        raise _bad(("nodes", node), f"must have exactly the fields {sorted(_ROW_FIELDS)}")
    gpus = _strings(row["gpus"], ("nodes", node, "gpus"), MAX_GPUS)
    nics = _strings(row["nics"], ("nodes", node, "nics"), MAX_NICS)
    _means(row["gpu_means"], ("nodes", node, "gpu_means"), len(gpus), gpu_width, text)
    _means(row["nic_means"], ("nodes", node, "nic_means"), len(nics), nic_width, text)


def _finite(value: Any) -> bool:
    """A finite float (the common case of ``_num``, checked in one step)."""
    return type(value) is float and value - value == 0.0


def _health(node: str, value: Any) -> None:
    # the usual state checked first, its error paths built only when one fails (a
    # path string a node and a call a GPU were half of stage 2's decoding)
    if type(value) is not dict or value.keys() != _HEALTH_FIELDS:
        _health_fields(node, value)
    state = value
    if not _finite(state["last"]):
        _num(state["last"], f"health.{node}.last", null_ok=True)
    cadence = state["cadence"]
    if cadence is not None and (not isinstance(cadence, list) or len(cadence) not in (2, 4)):
        raise _bad(f"health.{node}.cadence", "must be null, [interval, ticks due, arrivals, "
                   "own clock's last time] or, kept from an older state, [interval, mean gap]")
    for i, v in enumerate(cadence or []):
        if not _finite(v):
            _num(v, f"health.{node}.cadence[{i}]")
    if not isinstance(state["unplaced"], bool):
        raise _bad(f"health.{node}.unplaced", "must be true or false")
    gpus = state["gpus"]
    if type(gpus) is not dict:
        gpus = _obj(gpus, f"health.{node}.gpus")
    if len(gpus) > MAX_GPUS:
        raise _bad(f"health.{node}.gpus", f"holds more than {MAX_GPUS} GPUs")
    for gpu, g in gpus.items():
        # a GPU with nothing open (most of them): a finite ``last``, ``thr`` null
        if (type(g) is dict and "thr" in g and g["thr"] is None and _finite(g.get("last"))
                and "event" not in g and "remap" not in g):
            continue
        path = f"health.{node}.gpus.{gpu}"
        g = _obj(g, path)
        _num(g.get("last"), f"{path}.last")
        if "thr" not in g:
            raise _bad(path, "lacks thr (null: not throttled)")
        _num(g["thr"], f"{path}.thr", null_ok=True)
        for key in ("event", "remap"):
            if key in g:
                _obj(g[key], f"{path}.{key}")


def _health_fields(node: str, value: Any) -> None:
    path = f"health.{node}"
    state = _obj(value, path)
    if state.keys() != _HEALTH_FIELDS:
        raise _bad(path, f"must have exactly the fields {sorted(_HEALTH_FIELDS)}")


def _rows_at_once(rows: list[Any], gpu_width: int, nic_width: int, text: bool) -> bool:
    """Whether every row passes ``_rows``, told by passes in C over a part's rows
    where they are alike (the usual part: each node as many GPUs and as many NICs as
    the others). False where unsure: ``_rows`` then checks the rows one by one and
    names what fails. A Python step a node was two thirds of stage 2's decoding at
    16,384 nodes. ``text``: the means as ``/1``'s base64."""
    if not rows:
        return True
    if set(map(type, rows)) != {dict} or not all(map(eq, map(dict.keys, rows),
                                                     repeat(_ROW_FIELDS))):
        return False
    for names, means, limit, width in (("gpus", "gpu_means", MAX_GPUS, gpu_width),
                                       ("nics", "nic_means", MAX_NICS, nic_width)):
        listed = list(map(itemgetter(names), rows))
        if set(map(type, listed)) != {list}:
            return False
        counts = set(map(len, listed))
        if len(counts) != 1 or max(counts) > limit:
            return False
        flat = list(chain.from_iterable(listed))
        if flat and (set(map(type, flat)) != {str} or not 0 < min(map(len, flat))
                     or max(map(len, flat)) > 256):
            return False
        texts = list(map(itemgetter(means), rows))
        size = max(counts) * width * 8
        if not text:
            if set(map(type, texts)) != {bytes} or set(map(len, texts)) != {size}:
                return False
            continue
        length = -(-size // 3) * 4
        pad = length // 4 * 3 - size
        if set(map(type, texts)) != {str} or set(map(len, texts)) != {length}:
            return False
        joined = "".join(texts)
        # the alphabet deleted, only each text's padding is left, at each one's end
        if not joined.isascii() or joined.encode("ascii").translate(
                None, _B64_ALPHABET) != b"=" * (pad * len(texts)):
            return False
        if pad and not all(map(str.endswith, texts, repeat("=" * pad))):
            return False
    return True


def _event(i: int, value: Any) -> None:
    path = f"events[{i}]"
    ev = _obj(value, path)
    if set(ev) != _EVENT_FIELDS:
        raise _bad(path, f"must have exactly the fields {sorted(_EVENT_FIELDS)}")
    if ev["kind"] not in DETECTION_KINDS:
        raise _bad(f"{path}.kind", f"must be one of {DETECTION_KINDS}")
    if ev["severity"] not in SEVERITIES:
        raise _bad(f"{path}.severity", f"must be one of {SEVERITIES}")
    for key in ("node", "gpu"):
        if ev[key] is not None and not isinstance(ev[key], str):
            raise _bad(f"{path}.{key}", "must be a string or null")
    _num(ev["ts"], f"{path}.ts")
    _num(ev["since"], f"{path}.since")
    _num(ev["score"], f"{path}.score")
    _strings(ev["metrics"], f"{path}.metrics", 64)
    if not isinstance(ev["summary"], str):
        raise _bad(f"{path}.summary", "must be a string")
    _obj(ev["evidence"], f"{path}.evidence")
    if ev["fire_after"] is not None:
        _int(ev["fire_after"], f"{path}.fire_after", 0, 1 << 20)


def validate_summary(message: Any, *, text: bool = False) -> Summary:
    """Check one summary as held in memory (``vigil.summary/2``, each node's means
    bytes; ``text``: a parsed ``/1`` document, means as base64); return it or raise
    ``ContractError``."""
    msg = _obj(message, "summary")
    expected = SUMMARY_SCHEMA_V1 if text else SUMMARY_SCHEMA
    if msg.get("schema") != expected:
        raise ContractError("unknown_schema",
                            f"schema {msg.get('schema')!r}, expected {expected!r}")
    if not _FIELDS <= set(msg) <= _FIELDS | _OPTIONAL:
        extra, missing = set(msg) - _FIELDS - _OPTIONAL, _FIELDS - set(msg)
        raise ContractError("unknown_field" if extra else "missing_field",
                            f"unexpected {sorted(extra)}, missing {sorted(missing)}")
    if not isinstance(msg["job"], str) or not msg["job"] or job_problem(msg["job"]):
        raise ContractError("bad_name", f"job {msg['job']!r} is not a job id")
    shards = _int(msg["shards"], "shards", 1, MAX_SHARDS)
    _int(msg["shard"], "shard", 0, shards - 1)
    if msg["bin"] is not None:
        _int(msg["bin"], "bin", -MAX_BIN, MAX_BIN)
    if msg["next_bin"] is not None:
        _int(msg["next_bin"], "next_bin", -MAX_BIN, MAX_BIN)
    if msg["next_data_bin"] is not None:
        _int(msg["next_data_bin"], "next_data_bin", -MAX_BIN, MAX_BIN)
    parts = _int(msg["parts"], "parts", 1, MAX_PARTS)
    _int(msg["part"], "part", 0, parts - 1)
    if (_num(msg["bin_seconds"], "bin_seconds") or 0.0) <= 0:
        raise _bad("bin_seconds", "must be positive")
    _num(msg["max_ts"], "max_ts", null_ok=True)
    _num(msg.get("resumed"), "resumed", null_ok=True)
    _int(msg["late"], "late", 0, 1 << 62)
    if msg["declared"] is not None and not isinstance(msg["declared"], bool):
        raise _bad("declared", "must be true, false or null")
    gpu_metrics = _strings(msg["gpu_metrics"], "gpu_metrics", len(GPU_METRICS))
    nic_metrics = _strings(msg["nic_metrics"], "nic_metrics", len(NIC_METRICS))
    unknown = (set(gpu_metrics) - set(GPU_METRICS)) | (set(nic_metrics) - set(NIC_METRICS))
    if unknown:
        raise _bad("gpu_metrics/nic_metrics", f"name unknown metrics {sorted(unknown)}")
    nodes = _obj(msg["nodes"], "nodes")
    health = _obj(msg["health"], "health")
    clocks = msg.get("clocks", {})
    validate_clocks(clocks, NODES_PER_PART)
    # a node's name is checked once, though its rows, health and clock all name it
    for node in dict.fromkeys((*nodes, *health, *clocks)):
        if node_problem(node):
            raise ContractError("bad_name", f"node {node[:80]!r} is not a host name")
    if len(nodes) > NODES_PER_PART or len(health) > NODES_PER_PART:
        raise _bad("nodes", f"more than {NODES_PER_PART} nodes in one part")
    if not _rows_at_once(list(nodes.values()), len(gpu_metrics), len(nic_metrics), text):
        for node, rows in nodes.items():
            _rows(node, rows, len(gpu_metrics), len(nic_metrics), text)
    for node, state in health.items():
        _health(node, state)
    events = msg["events"]
    if not isinstance(events, list):
        raise _bad("events", "must be a list")
    for i, ev in enumerate(events):
        _event(i, ev)
    return cast(Summary, msg)


def decode_summary(raw: bytes | str,
                   parse: Callable[[bytes | str], Any] = parse_json) -> Summary:
    """Bytes from Kafka → a validated summary as held in memory (``ContractError``
    otherwise): ``/2``'s header and block, or a ``/1`` document (its means decoded
    from base64). ``parse`` reads the JSON (stage 2 passes a faster parser with
    ``parse_json``'s verdicts: ``streams/decode.parse_json_fast``)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    end = data.find(b"\n")
    if end < 0:  # one JSON document: ``/1``
        return _from_v1(validate_summary(parse(data), text=True))
    header = _obj(parse(data[:end]), "summary")
    if header.get("schema") != SUMMARY_SCHEMA:
        raise ContractError("unknown_schema", f"schema {header.get('schema')!r} before a "
                                              f"block of means, expected {SUMMARY_SCHEMA!r}")
    _attach_block(header, memoryview(data)[end + 1:])
    return validate_summary(header)


def _attach_block(header: dict[str, Any], block: memoryview) -> None:
    """Give each of the header's nodes its means, cut from ``block`` in the header's
    order (its GPUs', then its NICs'); the block must hold exactly what the header's
    devices and metrics take."""
    widths = []
    for key in ("gpu_metrics", "nic_metrics"):
        names = header.get(key)
        if not isinstance(names, list):
            raise _bad(key, "must be a list of metric names")
        widths.append(len(names) * 8)
    nodes = _obj(header.get("nodes"), "nodes")
    at = 0
    for node, row in nodes.items():
        row = _obj(row, ("nodes", node))
        if row.keys() != _HEADER_ROW_FIELDS:
            raise _bad(("nodes", node), "must have exactly the fields "
                                        f"{sorted(_HEADER_ROW_FIELDS)} before a block")
        for names, means, width in (("gpus", "gpu_means", widths[0]),
                                    ("nics", "nic_means", widths[1])):
            listed = row[names]
            size = len(listed) * width if isinstance(listed, list) else 0
            row[means] = bytes(block[at:at + size])
            at += size
    if at != len(block):
        raise _bad("block", f"holds {len(block)} bytes where the header's devices and "
                            f"metrics take {at}")


def _from_v1(summary: Summary) -> Summary:
    """A validated ``/1`` summary as ``/2`` holds it: its means decoded (they were
    checked to be strict base64 of the right length)."""
    for row in summary["nodes"].values():
        row["gpu_means"] = binascii.a2b_base64(row["gpu_means"])
        row["nic_means"] = binascii.a2b_base64(row["nic_means"])
    summary["schema"] = SUMMARY_SCHEMA
    return summary


def summary_header(summary: Summary) -> dict[str, Any]:
    """The summary's JSON header on the wire: every field, each node's rows naming
    its devices only (their means travel in the block)."""
    return {**summary, "nodes": {node: {"gpus": row["gpus"], "nics": row["nics"]}
                                 for node, row in summary["nodes"].items()}}


def _json_bytes(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False).encode()


def encode_summary(summary: Summary,
                   serialise: Callable[[dict[str, Any]], bytes] = _json_bytes) -> bytes:
    """A summary → its JSON header, a newline and its block of means, validated
    first; ``ContractError`` when it would exceed the contract's message size.
    ``serialise`` writes the header as compact JSON (no raw newline: JSON escapes
    one in a string; stage 1 passes a faster encoder of the same JSON)."""
    validate_summary(summary)
    rows = summary["nodes"].values()
    raw = b"".join((serialise(summary_header(summary)), b"\n",
                    *chain.from_iterable(map(itemgetter("gpu_means", "nic_means"), rows))))
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ContractError("too_large", f"summary part of {len(raw)} bytes > "
                                         f"{MAX_MESSAGE_BYTES}: fewer nodes a part")
    return raw


def rows_to_state(rows: dict[str, NodeRows]) -> dict[str, dict[str, Any]]:
    """Nodes' rows as JSON-able state (means as base64, as ``/1`` carried them)."""
    return {node: {**row, "gpu_means": base64.b64encode(row["gpu_means"]).decode(),
                   "nic_means": base64.b64encode(row["nic_means"]).decode()}
            for node, row in rows.items()}


def rows_from_state(rows: dict[str, dict[str, Any]]) -> dict[str, NodeRows]:
    """``rows_to_state`` undone."""
    return {node: cast(NodeRows, {**row, "gpu_means": base64.b64decode(row["gpu_means"]),
                                  "nic_means": base64.b64decode(row["nic_means"])})
            for node, row in rows.items()}


def split_parts(summary: Summary) -> Iterator[Summary]:
    """The summary as parts of at most ``NODES_PER_PART`` nodes each (rows and health
    of a node travel in one part; events in the first)."""
    clocks = summary.get("clocks")
    names = sorted(set(summary["nodes"]) | set(summary["health"]) | set(clocks or ()))
    chunks = [names[i:i + NODES_PER_PART] for i in range(0, len(names), NODES_PER_PART)]
    chunks = chunks or [[]]
    for k, chunk in enumerate(chunks):
        part: Summary = {**summary, "part": k, "parts": len(chunks),
                         "nodes": {n: summary["nodes"][n] for n in chunk
                                   if n in summary["nodes"]},
                         "health": {n: summary["health"][n] for n in chunk
                                    if n in summary["health"]},
                         "events": summary["events"] if k == 0 else []}
        if clocks is not None:
            part["clocks"] = {n: clocks[n] for n in chunk if n in clocks}
        yield part


__all__ = ["NODES_PER_PART", "NodeHealth", "NodeRows", "SummaryEvent", "decode_summary",
           "encode_summary", "rows_from_state", "rows_to_state", "split_parts",
           "summary_header", "validate_summary"]
