"""Build the JSON Schema documents of the contract from the catalog.

``python -m vigil_gpu_monitor.contracts.schema_gen`` rewrites ``contracts/schemas/``; a test fails
when the committed files differ from what the catalog produces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vigil_gpu_monitor.contracts import (
    DETECTION_SCHEMA,
    JOBCLOCK_SCHEMA,
    SAMPLE_SCHEMA,
    STEP_SCHEMA,
    SUMMARY_SCHEMA,
    SUMMARY_SCHEMA_V1,
)
from vigil_gpu_monitor.contracts.catalog import GPU_METRICS, HOST_METRICS, NIC_METRICS, Metric
from vigil_gpu_monitor.contracts.codec import (
    COST_BASES,
    DETECTION_KINDS,
    DETECTION_STATES,
    MAX_GPUS,
    MAX_ID_CHARS,
    MAX_NICS,
    SEVERITIES,
)
from vigil_gpu_monitor.contracts.jobclock import MAX_VOTERS
from vigil_gpu_monitor.contracts.names import (
    JOB_SCHEMA_PATTERN,
    MAX_NODE_CHARS,
    NODE_SCHEMA_PATTERN,
)
from vigil_gpu_monitor.contracts.shards import MAX_SHARDS
from vigil_gpu_monitor.contracts.steps import (
    COMPUTE_SLACK,
    MAX_RANK,
    MAX_RANKS,
    MAX_STEPS,
    MAX_WALL_SECONDS,
)
from vigil_gpu_monitor.contracts.summary import MAX_BIN, MAX_PARTS, NODES_PER_PART

SCHEMA_DIR = Path(__file__).parent / "schemas"
_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _metric_object(metrics: dict[str, Metric]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            name: {"type": "number", "minimum": 0, "maximum": m.high,
                   "description": f"{m.description} ({m.unit})"}
            for name, m in metrics.items()
        },
    }


def _id(empty_ok: bool) -> dict[str, Any]:
    return {"type": "string", "minLength": 0 if empty_ok else 1, "maxLength": MAX_ID_CHARS}


_NODE = {"type": "string", "minLength": 1, "maxLength": MAX_NODE_CHARS,
         "pattern": NODE_SCHEMA_PATTERN,
         "not": {"pattern": "^([Aa][Ll][Ll]|[Dd][Ee][Ff][Aa][Uu][Ll][Tt])$"},
         "description": "an RFC 1123 host name (contracts/names.py)"}
_JOB = {"type": "string", "maxLength": MAX_ID_CHARS, "pattern": JOB_SCHEMA_PATTERN,
        "description": "a job id, or empty for no job (contracts/names.py)"}


def sample_schema() -> dict[str, Any]:
    """JSON Schema of ``vigil.sample/1``."""
    return {
        "$schema": _DIALECT,
        "$id": "vigil.sample/1",
        "title": "One node's readings for one agent tick (key = job id)",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema", "ts", "job", "node", "gpus", "host", "nics"],
        "properties": {
            "schema": {"const": SAMPLE_SCHEMA},
            "ts": {"type": "number", "exclusiveMinimum": 0},
            "job": _JOB,
            "node": _NODE,
            "gpus": {"type": "object", "maxProperties": MAX_GPUS,
                     "propertyNames": {"pattern": "^[0-9]{1,3}$"},
                     "additionalProperties": _metric_object(GPU_METRICS)},
            "host": _metric_object(HOST_METRICS),
            "nics": {"type": "object", "maxProperties": MAX_NICS,
                     "propertyNames": {"minLength": 1, "maxLength": MAX_ID_CHARS},
                     "additionalProperties": _metric_object(NIC_METRICS)},
            "meta": {"type": "object"},
        },
    }


def detection_schema() -> dict[str, Any]:
    """JSON Schema of ``vigil.detection/1``."""
    nullable_id = {"oneOf": [{"type": "null"}, _id(empty_ok=False)]}
    return {
        "$schema": _DIALECT,
        "$id": "vigil.detection/1",
        "title": "A detector's finding, firing or resolved (key = job id)",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema", "id", "kind", "state", "severity", "job", "node", "gpu",
                     "started_at", "detected_at", "metrics", "score", "summary", "evidence"],
        "properties": {
            "schema": {"const": DETECTION_SCHEMA},
            "id": _id(empty_ok=False),
            "kind": {"enum": list(DETECTION_KINDS)},
            "state": {"enum": list(DETECTION_STATES)},
            "severity": {"enum": list(SEVERITIES)},
            "job": _JOB,
            "node": {"oneOf": [{"type": "null"}, _NODE]},
            "gpu": nullable_id,
            "started_at": {"type": "number"},
            "detected_at": {"type": "number"},
            "metrics": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"},
            "summary": {"type": "string"},
            "evidence": {
                "type": "object",
                "properties": {
                    "job_slowdown": {"type": ["number", "null"], "minimum": 0},
                    "job_gpus": {"type": "integer", "minimum": 0},
                    "gpu_hours_lost_per_hour": {"type": ["number", "null"], "minimum": 0},
                    "cost_basis": {"enum": list(COST_BASES)},
                },
            },
        },
    }


def step_schema() -> dict[str, Any]:
    """JSON Schema of ``vigil.step/1`` (the validator also checks ``compute`` against
    ``wall``, which JSON Schema cannot say: at most ``COMPUTE_SLACK`` × wall)."""
    index = {"type": "integer", "minimum": 0, "maximum": MAX_RANK}
    step = {
        "type": "object",
        "additionalProperties": False,
        "required": ["step", "end", "wall"],
        "properties": {
            "step": {"type": "integer", "minimum": 0, "maximum": 1 << 53,
                     "description": "the step's (iteration's) index in the job"},
            "end": {"type": "number", "exclusiveMinimum": 0,
                    "description": "when the step ended on this rank (Unix seconds, node clock)"},
            "wall": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_WALL_SECONDS,
                     "description": "the step's wall time on this rank (s)"},
            "compute": {"type": "number", "minimum": 0,
                        "description": "time the rank worked before it waited for its peers "
                                       f"(s, at most {COMPUTE_SLACK} x wall)"},
        },
    }
    rank = {
        "type": "object",
        "additionalProperties": False,
        "required": ["rank", "steps"],
        "properties": {
            "rank": {"oneOf": [{"type": "null"}, index]},
            "gpu": {"type": "string", "pattern": "^[0-9]{1,3}$"},
            "stage": index,
            "dp": index,
            "steps": {"type": "array", "maxItems": MAX_STEPS, "items": step},
        },
    }
    return {
        "$schema": _DIALECT,
        "$id": "vigil.step/1",
        "title": "One node's ranks' step timings for one or more steps (key = job id)",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema", "job", "node", "ranks"],
        "properties": {
            "schema": {"const": STEP_SCHEMA},
            "job": _id(empty_ok=False),
            "node": _id(empty_ok=False),
            "source": _id(empty_ok=False),
            "ranks": {"type": "array", "minItems": 1, "maxItems": MAX_RANKS, "items": rank},
            "meta": {"type": "object"},
        },
    }


def summary_schema(version: int = 2) -> dict[str, Any]:
    """JSON Schema of ``vigil.summary/2``'s header (stage 1 to stage 2 of a sharded
    job: the header, a newline, then the nodes' means as float64; docs/contract.md),
    or of ``/1``'s whole document (the means as base64 in each node's rows)."""
    names = {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 256}}
    number_or_null = {"oneOf": [{"type": "null"}, {"type": "number"}]}
    bin_ = {"type": "integer", "minimum": -MAX_BIN, "maximum": MAX_BIN}
    rows: dict[str, Any] = {
        "type": "object", "additionalProperties": False,
        "required": ["gpus", "nics"],
        "properties": {
            "gpus": {**names, "maxItems": MAX_GPUS},
            "nics": {**names, "maxItems": MAX_NICS},
        },
    }
    if version == 1:
        rows["required"] = ["gpus", "gpu_means", "nics", "nic_means"]
        rows["properties"].update(
            gpu_means={"type": "string", "contentEncoding": "base64",
                       "description": "float64, devices x gpu_metrics, NaN: no reading"},
            nic_means={"type": "string", "contentEncoding": "base64",
                       "description": "float64, devices x nic_metrics, NaN: no reading"})
    health = {
        "type": "object", "additionalProperties": False,
        "required": ["last", "cadence", "unplaced", "gpus"],
        "properties": {
            "last": number_or_null,
            "cadence": {"oneOf": [{"type": "null"},
                                  {"type": "array", "items": {"type": "number"},
                                   "minItems": 2, "maxItems": 4}]},
            "unplaced": {"type": "boolean"},
            "gpus": {"type": "object", "maxProperties": MAX_GPUS,
                     "additionalProperties": {
                         "type": "object", "required": ["last", "thr"],
                         "properties": {"last": {"type": "number"}, "thr": number_or_null,
                                        "event": {"type": "object"},
                                        "remap": {"type": "object"}}}},
        },
    }
    event = {
        "type": "object", "additionalProperties": False,
        "required": ["ts", "kind", "node", "gpu", "severity", "metrics", "score", "summary",
                     "since", "evidence", "fire_after"],
        "properties": {
            "ts": {"type": "number"}, "kind": {"enum": list(DETECTION_KINDS)},
            "node": {"oneOf": [{"type": "null"}, {"type": "string"}]},
            "gpu": {"oneOf": [{"type": "null"}, {"type": "string"}]},
            "severity": {"enum": list(SEVERITIES)}, "metrics": {**names, "maxItems": 64},
            "score": {"type": "number"}, "summary": {"type": "string"},
            "since": {"type": "number"}, "evidence": {"type": "object"},
            "fire_after": {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": 0}]},
        },
    }
    return {
        "$schema": _DIALECT,
        "$id": f"vigil.summary/{version}",
        "title": ("One stage-1 shard's sealed bin of a job, for stage 2 (key = job id)"
                  if version == 1 else
                  "The JSON header of one stage-1 shard's sealed bin of a job, for stage 2 "
                  "(key = job id); after it a newline, then the nodes' means: "
                  "little-endian float64, the header's nodes in order, each node's GPUs "
                  "then its NICs, devices x metrics"),
        "type": "object",
        "additionalProperties": False,
        "required": ["schema", "job", "shard", "shards", "bin", "next_bin", "part", "parts",
                     "bin_seconds", "max_ts", "next_data_bin", "late", "declared",
                     "gpu_metrics", "nic_metrics", "nodes", "health", "events"],
        "properties": {
            "schema": {"const": SUMMARY_SCHEMA if version == 2 else SUMMARY_SCHEMA_V1},
            "job": {**_JOB, "minLength": 1},
            "shard": {"type": "integer", "minimum": 0, "maximum": MAX_SHARDS - 1},
            "shards": {"type": "integer", "minimum": 1, "maximum": MAX_SHARDS},
            "bin": {"oneOf": [{"type": "null"}, bin_]},
            "next_bin": {"oneOf": [{"type": "null"}, bin_]},
            "part": {"type": "integer", "minimum": 0, "maximum": MAX_PARTS - 1},
            "parts": {"type": "integer", "minimum": 1, "maximum": MAX_PARTS},
            "bin_seconds": {"type": "number", "exclusiveMinimum": 0},
            "max_ts": number_or_null,
            "next_data_bin": {"oneOf": [{"type": "null"}, bin_]},
            "late": {"type": "integer", "minimum": 0},
            "declared": {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
            "gpu_metrics": {"type": "array", "items": {"enum": list(GPU_METRICS)}},
            "nic_metrics": {"type": "array", "items": {"enum": list(NIC_METRICS)}},
            "nodes": {"type": "object", "maxProperties": NODES_PER_PART,
                      "propertyNames": _NODE, "additionalProperties": rows},
            "health": {"type": "object", "maxProperties": NODES_PER_PART,
                       "propertyNames": _NODE, "additionalProperties": health},
            "events": {"type": "array", "items": event},
            "clocks": {"type": "object", "maxProperties": NODES_PER_PART,
                       "propertyNames": _NODE, "additionalProperties": {
                           "type": "array", "minItems": 2, "maxItems": 2,
                           "prefixItems": [{"type": "number"}, number_or_null]},
                       "description": "optional, in a bin's summary: each node the shard "
                                      "keeps → [latest raw timestamp, clock offset or null]"},
            "resumed": {"oneOf": [{"type": "null"}, {"type": "number"}],
                        "description": "optional, in a bin's summary: on the job's clock, "
                                       "when the latest of the shard's samples that had "
                                       "waited in its agent for the broker got through"},
        },
    }


def jobclock_schema() -> dict[str, Any]:
    """JSON Schema of ``vigil.jobclock/1`` (stage 2 back to a sharded job's stage 1)."""
    number_or_null = {"oneOf": [{"type": "null"}, {"type": "number"}]}
    return {
        "$schema": _DIALECT,
        "$id": "vigil.jobclock/1",
        "title": "A sharded job's clock and watermark, for its stage-1 shards "
                 "(key = job id, compacted)",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema", "job", "shards", "bin_seconds", "next_bin", "max_ts", "clock",
                     "reference", "voters", "at", "bin"],
        "properties": {
            "schema": {"const": JOBCLOCK_SCHEMA},
            "job": {**_JOB, "minLength": 1},
            "shards": {"type": "integer", "minimum": 1, "maximum": MAX_SHARDS},
            "bin_seconds": {"type": "number", "exclusiveMinimum": 0},
            "next_bin": {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": -MAX_BIN,
                                                      "maximum": MAX_BIN}]},
            "max_ts": number_or_null,
            "clock": number_or_null,
            "reference": number_or_null,
            "voters": {"type": "integer", "minimum": 0, "maximum": MAX_VOTERS},
            "at": {**number_or_null,
                   "description": "the job's watermark at the moment clock is of"},
            "bin": {"oneOf": [{"type": "null"}, {"type": "integer", "minimum": -MAX_BIN,
                                                 "maximum": MAX_BIN}],
                    "description": "the bin whose summaries clock was computed from"},
        },
    }


def rendered() -> dict[str, str]:
    """File name → JSON text, as committed under ``contracts/schemas/``."""
    docs = {"sample-1.json": sample_schema(), "detection-1.json": detection_schema(),
            "step-1.json": step_schema(), "summary-1.json": summary_schema(1),
            "summary-2.json": summary_schema(2),
            "jobclock-1.json": jobclock_schema()}
    return {name: json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
            for name, doc in docs.items()}


def main() -> int:
    """Rewrite the schema files from the catalog."""
    SCHEMA_DIR.mkdir(exist_ok=True)
    for name, text in rendered().items():
        (SCHEMA_DIR / name).write_text(text, encoding="utf-8")
        print(f"wrote {SCHEMA_DIR / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
