"""The goodput ledger: GPU-hours lost, per job and fleet, by day, cause and place.

Every costed detection (``evidence.gpu_hours_lost_per_hour``; a hang costs the whole
job) is an incident that loses its rate from ``started_at`` until it resolves; every
node the repair lifecycle holds out of service (``alerting/repair.py``) loses its
GPUs until it returns. The ledger keeps, in Redis (``P`` = key prefix):

- ``P:goodput:open``     hash: incident id → its job, kind, node, GPU, source, rate, start
- ``P:goodput:outopen``  hash: node → its GPUs and since when it is out
- ``P:goodput:day:<D>``  hash per UTC day: ``job|kind|node|gpu|source`` → GPU-hours
- ``P:goodput:days``     sorted set: the days written

A closed incident is written once, split over the days it spans, at its resolved
rate (the median of its estimates while open): so the day hashes add up exactly to
the detections' ``rate × duration``. Open ones are added when the ledger is read,
up to ``now``. ``source`` says where a figure comes from: ``timings`` (measured step
times, ``cost_basis: steps``), ``counters`` (estimated from counters) or
``lifecycle`` (a node out of service).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import redis

from vigil_gpu_monitor.contracts.messages import Detection

DAY = 86_400.0
OUT_OF_SERVICE = "out_of_service"
FIELD_SEP = "|"


def source_of(det: Detection) -> str:
    """Where a detection's cost comes from: measured step times or counters."""
    return "timings" if det["evidence"].get("cost_basis") == "steps" else "counters"


def rate_of(det: Detection) -> float | None:
    """GPU-hours per hour the incident loses (None: no estimate)."""
    ev = det["evidence"]
    value = ev.get("gpu_hours_lost_per_hour")
    if ev.get("cost_basis") == "hang" and value is None:
        value = ev.get("job_gpus")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def day_of(ts: float) -> str:
    """The UTC day a time falls in."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def split_days(start: float, end: float) -> Iterator[tuple[str, float]]:
    """(day, seconds) of ``[start, end)`` in each UTC day it spans."""
    at = start
    while at < end:
        boundary = (math.floor(at / DAY) + 1) * DAY
        stop = min(end, boundary)
        yield day_of(at), stop - at
        at = stop


class GoodputLedger:
    """GPU-hours lost, kept in Redis; written by the alerter, read by the CLI."""

    def __init__(self, r: redis.Redis, prefix: str = "vigil") -> None:
        self.r = r
        self.prefix = prefix
        self.open_key = f"{prefix}:goodput:open"
        self.out_key = f"{prefix}:goodput:outopen"
        self.days_key = f"{prefix}:goodput:days"

    def day_key(self, day: str) -> str:
        return f"{self.prefix}:goodput:day:{day}"

    def _write(self, pipe: Any, field: str, rate: float, start: float, end: float) -> None:
        for day, seconds in split_days(start, end):
            pipe.hincrbyfloat(self.day_key(day), field, rate * seconds / 3600)
            pipe.zadd(self.days_key, {day: math.floor(start / DAY) * DAY})

    def apply(self, det: Detection) -> None:
        """Account one firing or resolved detection (a duplicate is harmless: the
        incident is written once, when its open record is taken)."""
        if det["state"] == "firing":
            rate = rate_of(det)
            if rate is None:
                return
            record = {"job": det["job"], "kind": det["kind"], "node": det["node"] or "",
                      "gpu": det["gpu"] or "", "source": source_of(det), "rate": rate,
                      "since": det["started_at"]}
            self.r.hsetnx(self.open_key, det["id"], json.dumps(record))
            return
        raw = self.r.hget(self.open_key, det["id"])
        if raw is None or not self.r.hdel(self.open_key, det["id"]):
            return  # never costed, or already written
        record = json.loads(raw)
        rate = rate_of(det)
        final = rate if rate is not None else float(record["rate"])
        source = source_of(det) if rate is not None else record["source"]
        field = FIELD_SEP.join((record["job"], record["kind"], record["node"], record["gpu"],
                                source))
        pipe = self.r.pipeline()
        self._write(pipe, field, final, float(record["since"]), det["detected_at"])
        pipe.execute()

    def observe_out(self, out_nodes: dict[str, dict[str, str]], now: float) -> None:
        """The nodes the repair lifecycle holds out now (``RepairLog.out_nodes``): a new
        one starts losing its GPUs from its ``out_at``; one back in service is written
        up to ``now`` (the alerter calls this every tick)."""
        held: dict[bytes, bytes] = self.r.hgetall(self.out_key)  # type: ignore[assignment]
        known = {k.decode(): json.loads(v) for k, v in held.items()}
        for node, record in out_nodes.items():
            if node not in known:
                entry = {"gpus": int(record.get("gpus") or 0),
                         "since": float(record.get("out_at") or record.get("since") or now)}
                self.r.hsetnx(self.out_key, node, json.dumps(entry))
        for node, entry in known.items():
            if node in out_nodes or not self.r.hdel(self.out_key, node):
                continue
            field = FIELD_SEP.join(("", OUT_OF_SERVICE, node, "", "lifecycle"))
            pipe = self.r.pipeline()
            self._write(pipe, field, float(entry["gpus"]), float(entry["since"]), now)
            pipe.execute()

    def rows(self, since: float, until: float) -> list[tuple[str, dict[str, str], float]]:
        """(day, fields, GPU-hours) of everything lost in ``[since, until)``: closed
        incidents by the days they touched (whole days), open ones and nodes still out
        clipped to the range."""
        out: list[tuple[str, dict[str, str], float]] = []
        days: list[bytes] = self.r.zrangebyscore(  # type: ignore[assignment]
            self.days_key, math.floor(since / DAY) * DAY, until)
        for day in {d.decode() for d in days}:
            raw: dict[bytes, bytes] = self.r.hgetall(self.day_key(day))  # type: ignore[assignment]
            for field, hours in raw.items():
                out.append((day, _fields(field.decode()), float(hours)))
        opened: dict[bytes, bytes] = self.r.hgetall(self.open_key)  # type: ignore[assignment]
        for value in opened.values():
            rec = json.loads(value)
            fields = {k: str(rec[k]) for k in ("job", "kind", "node", "gpu", "source")}
            out.extend(_clipped(fields, float(rec["rate"]), float(rec["since"]), since, until))
        outs: dict[bytes, bytes] = self.r.hgetall(self.out_key)  # type: ignore[assignment]
        for node, value in outs.items():
            rec = json.loads(value)
            fields = {"job": "", "kind": OUT_OF_SERVICE, "node": node.decode(), "gpu": "",
                      "source": "lifecycle"}
            out.extend(_clipped(fields, float(rec["gpus"]), float(rec["since"]), since, until))
        return out

    def summary(self, since: float, until: float, job: str | None = None) -> dict[str, Any]:
        """GPU-hours lost in the range: the total, and by day, ISO week, kind, source,
        job, node and GPU (``node GPU g``)."""
        by: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        total = 0.0
        for day, f, hours in self.rows(since, until):
            if job is not None and f["job"] != job:
                continue
            total += hours
            by["day"][day] += hours
            by["week"][time.strftime("%G-W%V", time.strptime(day, "%Y-%m-%d"))] += hours
            by["kind"][f["kind"]] += hours
            by["source"][f["source"]] += hours
            by["job"][f["job"] or "(no job)"] += hours
            if f["node"]:
                by["node"][f["node"]] += hours
            if f["gpu"]:
                by["gpu"][f"{f['node']} GPU {f['gpu']}"] += hours
            by["day_kind"][f"{day}|{f['kind']}"] += hours
        return {"since": since, "until": until, "for_job": job, "total": total,
                **{k: dict(sorted(v.items())) for k, v in by.items()}}


def _fields(field: str) -> dict[str, str]:
    job, kind, node, gpu, source = (field.split(FIELD_SEP) + [""] * 5)[:5]
    return {"job": job, "kind": kind, "node": node, "gpu": gpu, "source": source}


def _clipped(fields: dict[str, str], rate: float, start: float, since: float,
             until: float) -> Iterator[tuple[str, dict[str, str], float]]:
    for day, seconds in split_days(max(start, since), until):
        yield day, fields, rate * seconds / 3600


def goodput_metrics(ledger: GoodputLedger, now: float | None = None) -> Iterator[Any]:
    """``vigil_goodput_lost_gpu_hours{window, kind, source}``: GPU-hours lost over the
    last day and the last week, from the ledger (nothing while Redis is away)."""
    from prometheus_client.core import GaugeMetricFamily

    now = time.time() if now is None else now
    family = GaugeMetricFamily("vigil_goodput_lost_gpu_hours",
                               "GPU-hours lost in the window, by finding kind and by where "
                               "the figure comes from (timings, counters, lifecycle)",
                               labels=["window", "kind", "source"])
    try:
        for window, seconds in (("day", DAY), ("week", 7 * DAY)):
            totals: dict[tuple[str, str], float] = defaultdict(float)
            for _, f, hours in ledger.rows(now - seconds, now):
                totals[f["kind"], f["source"]] += hours
            for (kind, source), hours in sorted(totals.items()):
                family.add_metric([window, kind, source], hours)
    except redis.RedisError:
        return
    yield family
