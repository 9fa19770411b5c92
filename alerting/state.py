"""Redis live state: open incidents per job and fleet-wide, and a bounded history.

Key layout (``P`` = ``redis.key_prefix``; ``{job}`` is a Redis Cluster hash tag, so
one job's keys share a slot and the compare-and-set below is atomic there):

- ``P:incident:{job}:<id>``  hash: ``detection`` (JSON), ``detected_at``, ``state``
- ``P:open:{job}``           hash: incident id → detection JSON, firing only
- ``P:open-jobs``            set of jobs with open incidents (fleet-wide index)
- ``P:status:{job}``         hash: ``node`` or ``node/gpu`` (or ``-`` for the job) →
                             JSON list of its open incident ids
- ``P:history``              stream of applied detections, capped near ``history_max``
- ``P:updates``              pub/sub channel: every applied detection
- ``P:deliveries``           stream: every channel delivery outcome (capped)
- ``P:undelivered``          stream: what a channel gave up on, with why (capped)
- ``P:live-jobs``            hash: job → its newest ``vigil.status/1`` (per-GPU heat)
- ``P:live-workers``         hash: worker → its newest heartbeat (lag, dead letters)

The incident hash also records ``told:<channel>`` for channels that delivered its
firing, so a restarted alerter sends resolves to the same channels.

Writes are idempotent and ordered: a detection is applied only when it is newer
than what the incident key holds (later ``detected_at``; at equal time, resolved
beats firing), so Kafka redeliveries and replays change nothing.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from vigil_gpu_monitor.contracts.messages import Detection

_APPLY = """
local cur = redis.call('HGET', KEYS[1], 'detected_at')
local cur_rank = tonumber(redis.call('HGET', KEYS[1], 'rank') or '-1')
local new_at = tonumber(ARGV[3])
local new_rank = tonumber(ARGV[4])
if cur then
  local cur_at = tonumber(cur)
  if new_at < cur_at or (new_at == cur_at and new_rank <= cur_rank) then
    return 0
  end
end
redis.call('HSET', KEYS[1], 'detection', ARGV[2], 'detected_at', ARGV[3], 'rank', ARGV[4])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
local ids = {}
local raw = redis.call('HGET', KEYS[3], ARGV[6])
if raw then ids = cjson.decode(raw) end
local kept = {}
for _, id in ipairs(ids) do if id ~= ARGV[1] then table.insert(kept, id) end end
if ARGV[4] == '0' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  table.insert(kept, ARGV[1])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
if #kept > 0 then
  redis.call('HSET', KEYS[3], ARGV[6], cjson.encode(kept))
else
  redis.call('HDEL', KEYS[3], ARGV[6])
end
return 1
"""
_RANK = {"firing": 0, "resolved": 1}
INCIDENT_TTL_SECONDS = 30 * 86400


class LiveState:
    """Reads and writes the live-state keys of one Redis (or Redis Cluster)."""

    def __init__(self, client: redis.Redis, prefix: str = "vigil",
                 history_max: int = 10000) -> None:
        self.r = client
        self.prefix = prefix
        self.history_max = history_max
        self._apply = client.register_script(_APPLY)

    def incident_key(self, job: str, incident: str) -> str:
        return f"{self.prefix}:incident:{{{job}}}:{incident}"

    def open_key(self, job: str) -> str:
        return f"{self.prefix}:open:{{{job}}}"

    def locations_key(self, job: str) -> str:
        """Hash: location in the job (``node``, ``node/gpu``, ``-``) → its open incidents."""
        return f"{self.prefix}:status:{{{job}}}"

    @property
    def jobs_key(self) -> str:
        return f"{self.prefix}:open-jobs"

    @property
    def history_key(self) -> str:
        return f"{self.prefix}:history"

    @property
    def updates_channel(self) -> str:
        return f"{self.prefix}:updates"

    def apply(self, det: Detection) -> bool:
        """Record one validated detection; False when it was a duplicate or stale."""
        job, incident = det["job"], det["id"]
        body = json.dumps(det, separators=(",", ":"), sort_keys=True)
        where = det["node"] or "-"
        if det["gpu"] is not None:
            where += f"/{det['gpu']}"
        applied = self._apply(
            keys=[self.incident_key(job, incident), self.open_key(job), self.locations_key(job)],
            args=[incident, body, repr(float(det["detected_at"])), _RANK[det["state"]],
                  INCIDENT_TTL_SECONDS, where])
        if not applied:
            return False
        if det["state"] == "firing":
            self.r.sadd(self.jobs_key, job)
        elif self.r.hlen(self.open_key(job)) == 0:
            self.r.srem(self.jobs_key, job)
        self.r.xadd(self.history_key, {"detection": body}, maxlen=self.history_max,
                    approximate=True)
        self.r.publish(self.updates_channel, body)
        return True

    def mark_told(self, job: str, incident: str, channel: str) -> None:
        """Remember that ``channel`` delivered this incident's firing."""
        self.r.hset(self.incident_key(job, incident), f"told:{channel}", 1)

    def told(self, job: str, incident: str) -> set[str]:
        """Channels that delivered this incident's firing."""
        fields: list[bytes] = self.r.hkeys(self.incident_key(job, incident))  # type: ignore[assignment]
        return {f.decode()[5:] for f in fields if f.startswith(b"told:")}

    def log_delivery(self, channel: str, det: Detection, result: str, attempts: int,
                     why: str) -> None:
        """Append to the delivery log; dead letters also go to ``P:undelivered``."""
        entry: dict[Any, Any] = {"channel": channel, "incident": det["id"], "job": det["job"],
                 "state": det["state"], "result": result, "attempts": attempts, "why": why[:300]}
        self.r.xadd(f"{self.prefix}:deliveries", entry, maxlen=self.history_max,
                    approximate=True)
        if result == "dead_letter":
            self.r.xadd(f"{self.prefix}:undelivered",
                        {**entry, "detection": json.dumps(det, separators=(",", ":"))},
                        maxlen=self.history_max, approximate=True)

    def deliveries(self, count: int = 100) -> list[dict[str, str]]:
        """The latest delivery outcomes, newest first."""
        entries: list[tuple[bytes, dict[bytes, bytes]]] = self.r.xrevrange(  # type: ignore[assignment]
            f"{self.prefix}:deliveries", count=count)
        return [{k.decode(): v.decode() for k, v in f.items()} for _, f in entries]

    def open_incidents(self, job: str | None = None) -> list[Detection]:
        """Firing detections of one job, or of the whole fleet."""
        members: set[bytes] = self.r.smembers(self.jobs_key)  # type: ignore[assignment]
        jobs = [job] if job else sorted(m.decode() for m in members)
        out: list[Detection] = []
        for j in jobs:
            out.extend(json.loads(v) for v in self.r.hvals(self.open_key(j)))
        return out

    def open_by_location(self, job: str) -> dict[str, list[str]]:
        """``node`` / ``node/gpu`` / ``-`` (job-level) → ids of its open incidents."""
        raw: dict[bytes, bytes] = self.r.hgetall(self.locations_key(job))  # type: ignore[assignment]
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def put_pipeline_status(self, status: dict[str, Any], seen: float | None = None) -> None:
        """Keep the newest status of a job or worker, stamped with when it was ``seen``
        (wall time); an older one arriving late is ignored."""
        key, field = ((f"{self.prefix}:live-jobs", status["job"]) if status["kind"] == "job"
                      else (f"{self.prefix}:live-workers", status["worker"]))
        old = self.r.hget(key, field)
        if old is None or json.loads(old)["ts"] <= status["ts"]:
            stamped = {**status, "seen": time.time() if seen is None else seen}
            self.r.hset(key, field, json.dumps(stamped, separators=(",", ":")))

    def pipeline_status(self, max_age: float | None = None,
                        now: float | None = None) -> dict[str, dict[str, Any]]:
        """``{"jobs": {job: status}, "workers": {worker: status}}``; with ``max_age``,
        only what was seen within that many seconds."""
        cutoff = None if max_age is None else (time.time() if now is None else now) - max_age
        out: dict[str, dict[str, Any]] = {}
        for kind in ("jobs", "workers"):
            raw: dict[bytes, bytes] = self.r.hgetall(  # type: ignore[assignment]
                f"{self.prefix}:live-{kind}")
            found = {k.decode(): json.loads(v) for k, v in raw.items()}
            out[kind] = {name: st for name, st in found.items()
                         if cutoff is None or st["seen"] >= cutoff}
        return out

    def prune_pipeline_status(self, older_than: float) -> int:
        """Forget job heat and heartbeats last seen before ``older_than`` (wall time)."""
        removed = 0
        for kind, entries in self.pipeline_status().items():
            stale = [name for name, st in entries.items() if st["seen"] < older_than]
            if stale:
                removed += int(self.r.hdel(f"{self.prefix}:live-{kind}", *stale))
        return removed

    def history(self, count: int = 100) -> list[dict[str, Any]]:
        """The latest applied detections, newest first."""
        entries: list[tuple[bytes, dict[bytes, bytes]]] = self.r.xrevrange(  # type: ignore[assignment]
            self.history_key, count=count)
        return [json.loads(fields[b"detection"]) for _, fields in entries]
