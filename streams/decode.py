"""Fast sample decoding for the worker and replay: msgspec parses and validates in one
pass; the contract stays the judge.

``contracts`` stays standard-library only (the node agent imports it), so the worker
brings its own parser. The types below are the contract's checks written as msgspec
types, built from the same catalog and ceilings: known field and metric names only,
numbers (never booleans) from 0 to each metric's ceiling, a positive finite time,
GPU indexes of 1-3 ASCII digits, node names and job ids (``contracts.names``) and the device counts.
msgspec checks them in C while it parses, about 2.4x faster than parsing with orjson
and validating the dicts in Python (bench/RESULTS.md, "Replay speed").

Whatever msgspec refuses is decoded again by the contract's own parser, leniently:
one bad reading (not a number, NaN, out of range) is taken out of the sample and
reported, not a dead-lettered node sample (DESIGN principle 14; the node's other
readings are still news). A message that stays invalid without its bad readings is
refused with exactly the reason ``contracts.codec`` gives, and a sample msgspec is
stricter about (a duplicate key, a lone surrogate) is still judged by the contract.
The one difference in what comes out: numbers are floats (the
contract keeps a JSON integer an int; they compare equal).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import msgspec
import orjson

from vigil_gpu_monitor.contracts import SAMPLE_SCHEMA
from vigil_gpu_monitor.contracts.catalog import GPU_METRICS, HOST_METRICS, NIC_METRICS, Metric
from vigil_gpu_monitor.contracts.codec import (
    MAX_GPUS,
    MAX_ID_CHARS,
    MAX_MESSAGE_BYTES,
    MAX_NICS,
    DroppedReading,
    decode_sample,
    metric_ceilings,
    parse_json,
)
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.contracts.names import JOB_PATTERN, NODE_PATTERN


def _readings(name: str, catalog: dict[str, Metric]) -> type:
    """One device's readings: every catalog metric optional, 0..its ceiling (the
    contract's own ceilings)."""
    ceilings = metric_ceilings(catalog)
    fields = [(metric, Annotated[float, msgspec.Meta(ge=0, le=ceilings[metric])],
               msgspec.UNSET) for metric in catalog]
    return msgspec.defstruct(name, fields, forbid_unknown_fields=True, omit_defaults=True)


_Gpu = _readings("GpuReadings", GPU_METRICS)
_Nic = _readings("NicReadings", NIC_METRICS)
_Host = _readings("HostReadings", HOST_METRICS)
_GpuIndex = Annotated[str, msgspec.Meta(pattern=r"\A[0-9]{1,3}\Z")]
_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_CHARS)]


class _Sample(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    schema: Literal[SAMPLE_SCHEMA]  # type: ignore[valid-type]
    ts: Annotated[float, msgspec.Meta(gt=0, le=sys.float_info.max)]
    job: Annotated[str, msgspec.Meta(pattern=JOB_PATTERN)]
    node: Annotated[str, msgspec.Meta(pattern=NODE_PATTERN)]
    gpus: Annotated[dict[_GpuIndex, _Gpu], msgspec.Meta(max_length=MAX_GPUS)]  # type: ignore[valid-type]
    host: _Host  # type: ignore[valid-type]
    nics: Annotated[dict[_Name, _Nic], msgspec.Meta(max_length=MAX_NICS)]  # type: ignore[valid-type]
    meta: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


_decoder = msgspec.json.Decoder(_Sample)


def decode_sample_fast(raw: bytes | str,
                       dropped: list[DroppedReading] | None = None) -> Sample:
    """Bytes from Kafka (or a trace line) → a validated sample dict, or
    ``ContractError`` with its reason. Readings the contract refuses one by one are
    taken out and appended to ``dropped`` (when given); the rest is kept."""
    out: list[DroppedReading] = [] if dropped is None else dropped
    if raw is None or len(raw) > MAX_MESSAGE_BYTES:
        return decode_sample(raw or b"", out)
    try:
        sample: Sample = msgspec.to_builtins(_decoder.decode(raw))
    except (msgspec.ValidationError, msgspec.DecodeError):
        return decode_sample(raw, out)  # drops bad readings; raises with the reason
    return sample


def parse_json_fast(raw: bytes | str) -> Any:
    """``contracts.codec.parse_json``'s result, by orjson: 1.4x faster on a summary
    part of 263 KB (1.8-2.0 against 2.5-2.9 ms, this machine, under load), where
    parsing was half of stage 2's decoding at 16,384 nodes (stage 2
    passes it to ``decode_summary``). What orjson refuses (broken JSON, NaN or
    Infinity, a lone surrogate, UTF-16) goes to ``parse_json``: what is accepted
    and a refusal's reason stay the contract's. One difference: an integer beyond
    64 bits comes out its nearest float (the summary's validator refuses a float
    wherever it reads an integer)."""
    if len(raw) <= MAX_MESSAGE_BYTES:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return parse_json(raw)
