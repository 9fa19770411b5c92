"""Encode and decode the two wire messages, validating against CONTRACT.md.

The validator is hand-written on the standard library (fast, and importable by
the light node agent); ``contracts/schemas/*.json`` say the same thing in JSON
Schema for outside consumers, and a test checks the two agree.

**One bad value costs one value** (DESIGN principle 14). A reading that is not a
number, not finite or outside its metric's range is a fault of that reading, not of
the node's sample: ``drop_bad_readings`` takes it out and says what it took, and the
lenient decoders (``decode_sample(raw, dropped=[...])``, the worker's and replay's)
accept the rest. What stays fatal to a whole message is what makes it unreadable or
untrusted as a whole: broken JSON, a wrong schema or field, a bad time or identifier
(``node`` and ``job`` follow ``contracts.names``: reason ``bad_name``), an unknown
metric name (it keeps user data off the wire). ``encode_sample`` stays
strict: the agent drops its bad readings before it publishes, so nothing bad is sent.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, cast

from vigil_gpu_monitor.contracts import DETECTION_SCHEMA, SAMPLE_SCHEMA
from vigil_gpu_monitor.contracts.catalog import GPU_METRICS, HOST_METRICS, NIC_METRICS, Metric
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import Detection, Sample
from vigil_gpu_monitor.contracts.names import job_problem, node_problem

MAX_MESSAGE_BYTES = 512 << 10  # under the broker's 1 MB default: oversize reaches us
MAX_ID_CHARS = 256
MAX_GPUS = 64
MAX_NICS = 64
DETECTION_KINDS = ("straggler", "network_bound", "hang", "gpu_health", "link_health",
                   "node_silent", "load_imbalance", "slowdown")
DETECTION_STATES = ("firing", "resolved")
SEVERITIES = ("info", "warning", "critical")
# evidence.cost_basis: how a detection's cost was estimated (docs/contract.md)
COST_BASES = ("baseline", "blamed", "none", "hang", "steps")

_SAMPLE_FIELDS = {"schema", "ts", "job", "node", "gpus", "host", "nics", "meta"}
_DETECTION_FIELDS = {"schema", "id", "kind", "state", "severity", "job", "node", "gpu",
                     "started_at", "detected_at", "metrics", "score", "summary", "evidence"}
_RATIO_SLACK = 1e-6  # float rounding in averaged ratios
_MAX_FLOAT_INT = 2 ** 1023  # larger integers do not fit a float (JSON allows them)
_NUMERIC = {float, int}  # exact types: bool (a subclass of int) is refused


class DroppedReading(NamedTuple):
    """One reading taken out of a sample: where (``gpus.0``, ``host``, ``nics.mlx5_0``),
    which metric, the contract's reason code (``out_of_range``, ``non_finite``,
    ``wrong_type``) and the detail."""

    device: str
    metric: str
    reason: str
    detail: str


def _reject_constant(token: str) -> float:
    raise ContractError("non_finite", f"JSON constant {token} is not a number")


def parse_json(raw: bytes | str, *, constants: bool = False) -> Any:
    """Parse one message; oversize and broken JSON raise ContractError, and so do
    NaN/Infinity unless ``constants`` (then they parse as floats, for a lenient
    decoder to drop as readings or refuse where they are not one)."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ContractError("too_large", f"{len(raw)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        if constants:
            return json.loads(raw)
        return json.loads(raw, parse_constant=_reject_constant)
    except ContractError:
        raise
    except RecursionError:
        raise ContractError("invalid_json", "nesting too deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ContractError("invalid_json", str(exc)[:200]) from None


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ContractError("wrong_type", f"{path} must be a number, got {type(value).__name__}")
    if isinstance(value, int) and not -_MAX_FLOAT_INT <= value <= _MAX_FLOAT_INT:
        raise ContractError("out_of_range", f"{path} is an integer of {value.bit_length()} bits")
    if not math.isfinite(value):
        raise ContractError("non_finite", f"{path} is {value}")
    return float(value)


def _string(value: Any, path: str, *, empty_ok: bool) -> str:
    if not isinstance(value, str):
        raise ContractError("wrong_type", f"{path} must be a string")
    if len(value) > MAX_ID_CHARS or (not empty_ok and not value):
        raise ContractError("bad_value", f"{path} must be 1..{MAX_ID_CHARS} characters")
    return value


def _name(value: Any, path: str, problem: Callable[[object], str | None]) -> str:
    """A node name or job id (``contracts.names``); ``bad_name`` otherwise."""
    if not isinstance(value, str):
        raise ContractError("wrong_type", f"{path} must be a string")
    why = problem(value)
    if why is not None:
        raise ContractError("bad_name", f"{path} {why}")
    return value


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ContractError("wrong_type", f"{path} must be an object")
    return value


def metric_ceilings(catalog: dict[str, Metric]) -> dict[str, float]:
    """metric → the largest value the contract accepts."""
    return {name: m.high + (_RATIO_SLACK if m.unit == "ratio" else 0)
            for name, m in catalog.items()}


_GPU_CEILINGS = metric_ceilings(GPU_METRICS)
_HOST_CEILINGS = metric_ceilings(HOST_METRICS)
_NIC_CEILINGS = metric_ceilings(NIC_METRICS)


def _metrics(value: Any, path: str, catalog: dict[str, Metric],
             ceilings: dict[str, float]) -> None:
    """Every reading is a catalog metric with a finite number in range.

    The fast path runs as C loops over the whole object: known names, numeric types,
    non-negative, under each ceiling (NaN and ±inf fail the ceiling comparison). Only
    a failing object is re-checked slowly to name the exact reason.
    """
    if type(value) is dict:
        readings = value.values()
        if (value.keys() <= ceilings.keys() and set(map(type, readings)) <= _NUMERIC
                and (not value or min(readings) >= 0)
                and all(map(operator.le, readings, map(ceilings.__getitem__, value)))):
            return
    _metrics_slow(value, path, catalog)


def _metrics_slow(value: Any, path: str, catalog: dict[str, Metric]) -> None:
    for name, reading in _object(value, path).items():
        metric = catalog.get(name)
        if metric is None:
            raise ContractError("unknown_metric", f"{path}.{name} is not in the catalog")
        bad = _bad_reading(reading, metric, f"{path}.{name}")
        if bad is not None:
            raise bad


def _bad_reading(reading: Any, metric: Metric, path: str) -> ContractError | None:
    """Why the contract refuses this one reading of a known metric, or None."""
    try:
        number = _number(reading, path)
    except ContractError as exc:
        return exc
    ceiling = metric.high + (_RATIO_SLACK if metric.unit == "ratio" else 0)
    if number < 0 or number > ceiling:
        return ContractError("out_of_range",
                             f"{path}={number} outside 0..{metric.high:g} {metric.unit}")
    return None


def _drop_from(readings: Any, path: str, catalog: dict[str, Metric],
               ceilings: dict[str, float], out: list[DroppedReading]) -> None:
    if type(readings) is not dict:
        return  # not an object: validation refuses the message
    values = readings.values()
    if (readings.keys() <= ceilings.keys() and set(map(type, values)) <= _NUMERIC
            and (not readings or min(values) >= 0)
            and all(map(operator.le, values, map(ceilings.__getitem__, readings)))):
        return  # the common case: nothing to drop, checked as C loops
    for name in list(readings):
        metric = catalog.get(name)
        if metric is None:
            continue  # an unknown name stays: validation refuses the message for it
        bad = _bad_reading(readings[name], metric, f"{path}.{name}")
        if bad is not None:
            del readings[name]
            out.append(DroppedReading(path, name, bad.reason, bad.detail))


def drop_bad_readings(sample: Any) -> list[DroppedReading]:
    """Take out of ``sample`` (in place) every reading the contract refuses on its own
    (not a number, NaN or infinite, outside its metric's range) and return what was
    taken. Anything else wrong with the sample is left for ``validate_sample``."""
    dropped: list[DroppedReading] = []
    if not isinstance(sample, dict):
        return dropped
    gpus, nics = sample.get("gpus"), sample.get("nics")
    if isinstance(gpus, dict):
        for index, readings in gpus.items():
            _drop_from(readings, f"gpus.{index}", GPU_METRICS, _GPU_CEILINGS, dropped)
    _drop_from(sample.get("host"), "host", HOST_METRICS, _HOST_CEILINGS, dropped)
    if isinstance(nics, dict):
        for nic, readings in nics.items():
            _drop_from(readings, f"nics.{nic}", NIC_METRICS, _NIC_CEILINGS, dropped)
    return dropped


def _check_fields(message: dict[str, Any], allowed: set[str], required: set[str]) -> None:
    extra = set(message) - allowed
    if extra:
        raise ContractError("unknown_field", f"unexpected field(s) {sorted(extra)}")
    missing = required - set(message)
    if missing:
        raise ContractError("missing_field", f"missing field(s) {sorted(missing)}")


def _check_schema(message: dict[str, Any], expected: str) -> None:
    schema = message.get("schema")
    if schema != expected:
        raise ContractError("unknown_schema", f"schema {schema!r}, expected {expected!r}")


def validate_sample(message: Any) -> Sample:
    """Check one decoded ``vigil.sample/1``; return it unchanged or raise ContractError."""
    sample = _object(message, "sample")
    _check_schema(sample, SAMPLE_SCHEMA)
    _check_fields(sample, _SAMPLE_FIELDS, _SAMPLE_FIELDS - {"meta"})
    if _number(sample["ts"], "ts") <= 0:
        raise ContractError("out_of_range", "ts must be positive Unix seconds")
    _name(sample["job"], "job", job_problem)
    _name(sample["node"], "node", node_problem)
    gpus = _object(sample["gpus"], "gpus")
    if len(gpus) > MAX_GPUS:
        raise ContractError("out_of_range", f"{len(gpus)} GPUs > {MAX_GPUS}")
    for index, readings in gpus.items():
        if not (index.isdigit() and index.isascii() and len(index) <= 3):
            raise ContractError("bad_value", f"gpus key {index!r} must be a GPU index")
        _metrics(readings, f"gpus.{index}", GPU_METRICS, _GPU_CEILINGS)
    _metrics(sample["host"], "host", HOST_METRICS, _HOST_CEILINGS)
    nics = _object(sample["nics"], "nics")
    if len(nics) > MAX_NICS:
        raise ContractError("out_of_range", f"{len(nics)} NICs > {MAX_NICS}")
    for nic, readings in nics.items():
        _string(nic, "nics key", empty_ok=False)
        _metrics(readings, f"nics.{nic}", NIC_METRICS, _NIC_CEILINGS)
    if "meta" in sample:
        _object(sample["meta"], "meta")
    return cast(Sample, sample)


def validate_detection(message: Any) -> Detection:
    """Check one decoded ``vigil.detection/1``; return it unchanged or raise ContractError."""
    det = _object(message, "detection")
    _check_schema(det, DETECTION_SCHEMA)
    _check_fields(det, _DETECTION_FIELDS, _DETECTION_FIELDS)
    _string(det["id"], "id", empty_ok=False)
    for field, allowed in (("kind", DETECTION_KINDS), ("state", DETECTION_STATES),
                           ("severity", SEVERITIES)):
        if det[field] not in allowed:
            raise ContractError("bad_value", f"{field} {det[field]!r} not one of {allowed}")
    _name(det["job"], "job", job_problem)
    if det["node"] is not None:
        _name(det["node"], "node", node_problem)
    if det["gpu"] is not None:
        _string(det["gpu"], "gpu", empty_ok=False)
    _number(det["started_at"], "started_at")
    _number(det["detected_at"], "detected_at")
    _number(det["score"], "score")
    metrics = det["metrics"]
    if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
        raise ContractError("wrong_type", "metrics must be an array of strings")
    if not isinstance(det["summary"], str):
        raise ContractError("wrong_type", "summary must be a string")
    _check_cost(_object(det["evidence"], "evidence"))
    return cast(Detection, det)


def _check_cost(evidence: dict[str, Any]) -> None:
    """The cost fields, where present: non-negative numbers (null: not estimable)."""
    for field in ("job_slowdown", "gpu_hours_lost_per_hour"):
        if evidence.get(field) is not None and _number(evidence[field], f"evidence.{field}") < 0:
            raise ContractError("out_of_range", f"evidence.{field} is negative")
    gpus = evidence.get("job_gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
        raise ContractError("wrong_type", "evidence.job_gpus must be a non-negative integer")
    basis = evidence.get("cost_basis")
    if basis is not None and basis not in COST_BASES:
        raise ContractError("bad_value", f"evidence.cost_basis {basis!r} not one of {COST_BASES}")


def decode_sample(raw: bytes | str, dropped: list[DroppedReading] | None = None) -> Sample:
    """Bytes from Kafka or a trace line → a validated sample dict.

    Strict by default: any bad reading refuses the message. With a ``dropped`` list,
    lenient as the worker is: bad readings (NaN and Infinity included) are taken
    out and appended to it, and the rest of the sample is judged as usual."""
    if dropped is None:
        return validate_sample(parse_json(raw))
    message = parse_json(raw, constants=True)
    dropped.extend(drop_bad_readings(message))
    return validate_sample(message)


def decode_detection(raw: bytes | str) -> Detection:
    """Bytes from Kafka or a replay line → a validated detection dict."""
    return validate_detection(parse_json(raw))


def _dump(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False).encode()


def encode_sample(sample: Sample) -> bytes:
    """A sample dict → compact UTF-8 JSON, validated first so nothing bad is published."""
    return _dump(validate_sample(sample))


def encode_detection(detection: Detection) -> bytes:
    """A detection dict → compact UTF-8 JSON, validated first."""
    return _dump(validate_detection(detection))


def decode_trace(lines: Iterable[bytes | str],
                 on_invalid: Callable[[int, ContractError], None] | None = None,
                 decode: Callable[[bytes | str], Sample] = decode_sample,
                 ) -> Iterator[Sample]:
    """The valid samples of a JSON-lines trace (one ``vigil.sample/1`` a line), in file
    order. Blank lines are skipped; an invalid line goes to ``on_invalid(line number,
    error)`` and is skipped, so one bad line never ends a replay. ``decode`` may be a
    faster parser that fails with the same reasons (``streams.decode``)."""
    for lineno, line in enumerate(lines, 1):
        if not line or line.isspace():  # blank (``strip`` would copy every line)
            continue
        try:
            sample = decode(line)
        except ContractError as exc:
            if on_invalid is not None:
                on_invalid(lineno, exc)
            continue
        yield sample
