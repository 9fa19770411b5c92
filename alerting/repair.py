"""Closed-loop repair: every node Vigil takes out comes back verified, or stays out
with a reason a person can read (DESIGN principle 15).

States: ``in_service`` → ``out`` (Vigil drained or cordoned it) → ``awaiting_repair``
→ ``verifying`` → ``in_service`` again, or ``held_out`` (a person decides).

What starts verification:
- a GPU reset the executor carried out (``reset_gpu``): at once;
- a replaced GPU: a changed ``meta.gpu_uuids`` on the node (``observe_uuids``);
- a person: ``vigil repair done NODE [--note …]`` (``repair_done``);
- a cordoned straggler: ``repair_straggler_wait_seconds`` after the cordon.

Verification runs the site's check command through the executor (status and output
kept), then watches Vigil's own evidence for ``repair_evidence_seconds``. The alerter
sees detections, not raw samples, so the evidence is the absence of a firing
``gpu_health`` or ``link_health`` detection on the node during the window and of any
open at its end: those are the detectors that read XIDs, ECC and row remaps, PCIe
generation and width, held-down clocks, NVLink and NICs. A pass returns the node
(``release``) only if Vigil's own drain or taint still holds it; a node a person or
another tool holds out is never returned. A returned node is on probation: the same
fault within ``repair_probation_seconds`` holds it out and escalates.

Everything is in Redis (``P`` = key prefix), so a restarted alerter or a second
replica carries on where the first stopped:

- ``P:repair:node:<node>``  hash: ``state``, ``since``, ``why``, ``who`` and the
  fields of the current repair (incident, action, out_at, gpus, check results…)
- ``P:repair:out``          sorted set: nodes not in service → when they went out
- ``P:repair:log``          stream: every transition (node, from, to, why, who, at)
- ``P:repair:stats``        hash: returns and the repair-time histogram's buckets
"""

from __future__ import annotations

import json
import logging
import shlex
import time
from collections.abc import Callable
from typing import Any

import redis

from vigil_gpu_monitor.alerting.executors import CheckResult, ExecutorError, Returner
from vigil_gpu_monitor.contracts.config import AlerterConfig
from vigil_gpu_monitor.contracts.messages import Action, Detection

log = logging.getLogger(__name__)
IN_SERVICE, OUT, AWAITING, VERIFYING, HELD = (
    "in_service", "out", "awaiting_repair", "verifying", "held_out")
STATES = (IN_SERVICE, OUT, AWAITING, VERIFYING, HELD)
NOT_IN_SERVICE = (OUT, AWAITING, VERIFYING, HELD)
EVIDENCE_KINDS = ("gpu_health", "link_health")  # what a repaired node must not show
VIGIL = "vigil"
# histogram buckets of out → returned, seconds: 10 min … 1 week
REPAIR_BUCKETS = (600.0, 1800.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0, 3 * 86400.0,
                  7 * 86400.0)
LOG_MAX = 10000

# KEYS: node hash, out index, log stream. ARGV: node, allowed-from ("*" = any) as JSON
# list, new state, fields JSON, entry JSON, now, ttl seconds when in service
_TRANSITION = """
local cur = redis.call('HGET', KEYS[1], 'state') or 'in_service'
local allowed = cjson.decode(ARGV[2])
local ok = false
for _, s in ipairs(allowed) do if s == '*' or s == cur then ok = true end end
if not ok then return cur end
local fields = cjson.decode(ARGV[4])
for k, v in pairs(fields) do
  if v == cjson.null or v == '' then redis.call('HDEL', KEYS[1], k)
  else redis.call('HSET', KEYS[1], k, v) end
end
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'since', ARGV[6])
local entry = cjson.decode(ARGV[5])
entry['from'] = cur
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[8], '*', 'entry', cjson.encode(entry))
if ARGV[3] == 'in_service' then
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[7]))
else
  redis.call('PERSIST', KEYS[1])
  local at = redis.call('HGET', KEYS[1], 'out_at') or ARGV[6]
  redis.call('ZADD', KEYS[2], at, ARGV[1])
end
return 'ok'
"""


class TransitionRefused(Exception):
    """The node was not in a state this change may start from (someone else moved it)."""


class RepairLog:
    """The lifecycle's Redis records: read by the CLI, written by the alerter and by
    people through the CLI (every write a compare-and-set on the node's state)."""

    def __init__(self, r: redis.Redis, prefix: str) -> None:
        self.r = r
        self.prefix = prefix
        self.index_key = f"{prefix}:repair:out"
        self.log_key = f"{prefix}:repair:log"
        self.stats_key = f"{prefix}:repair:stats"
        self._transition = r.register_script(_TRANSITION)

    def node_key(self, node: str) -> str:
        return f"{self.prefix}:repair:node:{node}"

    def record(self, node: str) -> dict[str, str]:
        """The node's lifecycle fields (``state`` is ``in_service`` when none)."""
        raw: dict[bytes, bytes] = self.r.hgetall(self.node_key(node))  # type: ignore[assignment]
        found = {k.decode(): v.decode() for k, v in raw.items()}
        found.setdefault("state", IN_SERVICE)
        return found

    def state(self, node: str) -> str:
        return self.record(node)["state"]

    def out_nodes(self) -> dict[str, dict[str, str]]:
        """Every node not in service → its record, longest out first."""
        names: list[bytes] = self.r.zrange(self.index_key, 0, -1)  # type: ignore[assignment]
        return {n.decode(): self.record(n.decode()) for n in names}

    def move(self, node: str, allowed: tuple[str, ...], to: str, why: str, who: str,
             now: float, probation: float = 86400.0, **fields: Any) -> None:
        """Change the node's state if it is in one of ``allowed`` (``("*",)``: any),
        setting ``fields`` (None or "" deletes one); logs why, when and who."""
        if to not in STATES:
            raise ValueError(f"unknown repair state {to!r}")
        values = {k: (None if v is None else str(v)) for k, v in fields.items()}
        values.update(why=why, who=who)
        entry = {"node": node, "to": to, "why": why, "who": who, "at": now,
                 **{k: v for k, v in fields.items() if k in ("incident", "action", "note")}}
        ttl = int(max(probation, 0) + 7 * 86400)
        result = self._transition(
            keys=[self.node_key(node), self.index_key, self.log_key],
            args=[node, json.dumps(list(allowed)), to, json.dumps(values), json.dumps(entry),
                  repr(now), ttl, LOG_MAX])
        if result != b"ok":
            raise TransitionRefused(f"{node} is {result.decode()}, not "
                                    f"{' or '.join(allowed)}: cannot move it to {to}")
        log.info("repair %s -> %s by %s: %s", node, to, who, why)

    def history(self, node: str | None = None, count: int = 200) -> list[dict[str, Any]]:
        """Transitions, newest first; of one node when ``node`` is given."""
        entries: list[tuple[bytes, dict[bytes, bytes]]] = self.r.xrevrange(  # type: ignore[assignment]
            self.log_key, count=count if node is None else count * 20)
        rows = [json.loads(f[b"entry"]) for _, f in entries]
        return [e for e in rows if node is None or e["node"] == node][:count]

    def observe_return(self, seconds: float, gpu_hours: float) -> None:
        """Count a returned node in the repair-time histogram and GPU-hours held out."""
        pipe = self.r.pipeline()
        for bound in REPAIR_BUCKETS:
            if seconds <= bound:
                pipe.hincrby(self.stats_key, f"le:{bound:g}", 1)
        pipe.hincrby(self.stats_key, "count", 1)
        pipe.hincrbyfloat(self.stats_key, "sum", seconds)
        pipe.hincrbyfloat(self.stats_key, "gpu_hours_returned", gpu_hours)
        pipe.execute()

    def stats(self) -> dict[str, float]:
        raw: dict[bytes, bytes] = self.r.hgetall(self.stats_key)  # type: ignore[assignment]
        return {k.decode(): float(v) for k, v in raw.items()}


def gpu_hours(record: dict[str, str], now: float) -> float:
    """GPU-hours a node has been out: its GPUs × hours since it went out."""
    out_at = float(record.get("out_at") or now)
    return int(record.get("gpus") or 0) * max(0.0, now - out_at) / 3600.0


def fault_of(det: Detection) -> str:
    """What a fault is, for probation's "the same fault again": kind and cause."""
    evidence: dict[str, Any] = det["evidence"] or {}
    cause = evidence.get("action") or evidence.get("metric") or ""
    return f"{det['kind']}:{cause}"


def verify(log_: RepairLog, node: str, why: str, who: str, now: float,
           allowed: tuple[str, ...], **fields: Any) -> None:
    """Start the node's verification afresh (its check runs at the next tick)."""
    log_.move(node, allowed, VERIFYING, why, who, now, check_rc=None, check_output=None,
              evidence_from=None, evidence_failed=None, deferred=None, **fields)


def repair_done(log_: RepairLog, node: str, who: str, note: str,
                now: float | None = None) -> None:
    """A person reports the node repaired (``vigil repair done``): verify it, also
    from ``held_out``. Refused (``TransitionRefused``) for a node Vigil does not hold."""
    now = time.time() if now is None else now
    why = f"repair reported by {who}" + (f": {note}" if note else "")
    verify(log_, node, why, who, now, (OUT, AWAITING, HELD), note=note)


class RepairLoop:
    """Drives each node Vigil took out through verification and back (``tick``)."""

    def __init__(self, cfg: AlerterConfig, r: redis.Redis, prefix: str, executor: Returner,
                 open_on_node: Callable[[str], list[Detection]],
                 audit: Callable[[Action, str, str, float], Action],
                 escalate: Callable[[Detection], None] | None = None) -> None:
        self.cfg = cfg
        self.log = RepairLog(r, prefix)
        self.r = r
        self.executor = executor
        self.open_on_node = open_on_node
        self.audit = audit
        self.escalate = escalate
        self.lock_base = f"{prefix}:remediation:lock"
        self.returns_key = f"{prefix}:repair:returns"

    # events ---------------------------------------------------------------------

    def taken_out(self, action: Action, det: Detection, now: float) -> None:
        """An executed action took the node out: record it and pick its next step."""
        evidence = det.get("evidence") or {}
        nodes, gpus = int(evidence.get("job_nodes") or 0), int(evidence.get("job_gpus") or 0)
        per_node = gpus // nodes if nodes and gpus else self.cfg.gpus_per_node
        fields: dict[str, Any] = {
            "incident": action["incident"], "action": action["action"], "job": action["job"],
            "gpu": action.get("gpu"), "fault": fault_of(det), "out_at": now, "gpus": per_node,
            "summary": action["summary"][:300], "verify_after": None, "check_rc": None,
            "check_output": None, "evidence_from": None, "evidence_failed": None,
            "probation_until": None, "deferred": None, "note": None}
        self.log.move(action["node"], ("*",), OUT, f"{action['action']}: {action['summary']}",
                      VIGIL, now, **fields)
        if action["action"] == "reset_gpu":
            self._verify(action["node"], "the executor reset the GPU", VIGIL, now, (OUT,))
        elif action["action"] == "cordon":
            self.log.move(action["node"], (OUT,), AWAITING,
                          f"straggler cordoned: verified after "
                          f"{self.cfg.repair_straggler_wait_seconds:g}s", VIGIL, now,
                          verify_after=now + self.cfg.repair_straggler_wait_seconds)
        else:
            self.log.move(action["node"], (OUT,), AWAITING,
                          "waiting for the repair: `vigil repair done` or a new GPU UUID",
                          VIGIL, now)

    def observe_uuids(self, node: str, uuids: dict[str, str], now: float | None = None) -> bool:
        """A sample's ``meta.gpu_uuids``: the first seen while the node is out is its
        baseline; a later change is a replaced GPU. True when verification started."""
        record = self.log.record(node)
        if record["state"] not in (OUT, AWAITING):
            return False
        seen = json.dumps(uuids, sort_keys=True)
        baseline = record.get("uuids")
        now = time.time() if now is None else now
        if baseline is None:
            self.r.hsetnx(self.log.node_key(node), "uuids", seen)
            return False
        if baseline == seen:
            return False
        old: dict[str, str] = json.loads(baseline)
        changed = sorted(g for g in set(old) | set(uuids) if old.get(g) != uuids.get(g))
        try:
            self._verify(node, f"GPU UUID changed on GPU {', '.join(changed)}: a replaced GPU",
                         VIGIL, now, (OUT, AWAITING), uuids=seen)
        except TransitionRefused:
            return False
        return True

    def on_detection(self, det: Detection, now: float | None = None) -> str | None:
        """Evidence and probation: a firing health detection on a verifying node fails
        its window; the same fault on a node on probation holds it out. Returns the
        node's state when the detection concerns a node Vigil holds out (the caller
        then plans no new action for it)."""
        node = det["node"]
        if det["state"] != "firing" or node is None:
            return None
        now = time.time() if now is None else now
        record = self.log.record(node)
        state = record["state"]
        if state == VERIFYING and det["kind"] in EVIDENCE_KINDS \
                and "evidence_failed" not in record:
            self.r.hset(self.log.node_key(node), "evidence_failed",
                        f"{det['kind']} fired during verification: {det['summary']}"[:300])
        if state == IN_SERVICE and float(record.get("probation_until") or 0) > now \
                and fault_of(det) == record.get("fault"):
            self._probation_failed(node, record, det, now)
            return HELD
        return state if state in NOT_IN_SERVICE else None

    # the loop -------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """Advance every node not in service whose next step is due."""
        now = time.time() if now is None else now
        for node, record in self.log.out_nodes().items():
            try:
                if record["state"] == AWAITING and record.get("verify_after") \
                        and float(record["verify_after"]) <= now:
                    self._verify(node, "the straggler's wait passed", VIGIL, now, (AWAITING,))
                elif record["state"] == VERIFYING:
                    self._advance(node, record, now)
            except TransitionRefused as exc:
                log.info("repair of %s moved on meanwhile: %s", node, exc)

    def _verify(self, node: str, why: str, who: str, now: float,
                allowed: tuple[str, ...], **fields: Any) -> None:
        verify(self.log, node, why, who, now, allowed, **fields)

    def _advance(self, node: str, record: dict[str, str], now: float) -> None:
        """Run the check once, then wait out the evidence window, then return or hold."""
        if "evidence_from" not in record:
            result = self._check(node, record, now)
            if not result.passed:
                self._hold(node, f"check failed (exit {result.rc}): "
                           f"{result.output.strip()[-200:]}", now)
            return
        if now < float(record["evidence_from"]) + self.cfg.repair_evidence_seconds:
            return
        failed = record.get("evidence_failed")
        still = [d for d in self.open_on_node(node) if d["kind"] in EVIDENCE_KINDS]
        if failed or still:
            self._hold(node, failed or f"{still[0]['kind']} still open at the end of the "
                       f"evidence window: {still[0]['summary']}", now)
            return
        self._return(node, record, now)

    def _check(self, node: str, record: dict[str, str], now: float) -> CheckResult:
        fields = {"node": node, "gpu": record.get("gpu", ""), "job": record.get("job", ""),
                  "incident": record.get("incident", "")}
        try:
            argv = [p.format(**fields) for p in shlex.split(self.cfg.repair_check_command)]
        except (KeyError, ValueError) as exc:
            result = CheckResult(None, f"alerter.repair_check_command cannot be used: {exc}")
        else:
            result = self.executor.check(argv, self.cfg.repair_check_timeout_seconds)
        self.r.hset(self.log.node_key(node), mapping={
            "check_rc": "none" if result.rc is None else str(result.rc),
            "check_output": result.output, "evidence_from": repr(now)})
        self.audit(self._action(node, record, "verify_check", now),
                   "executed" if result.passed else "failed",
                   f"check exit {result.rc}: {result.output.strip()[-500:]}", now)
        return result

    def _return(self, node: str, record: dict[str, str], now: float) -> None:
        """Return the node if Vigil still holds it and the rails allow; else say why."""
        action = self._action(node, record, "return", now)
        try:
            hold = self.executor.holder(node)
        except ExecutorError as exc:
            self._defer(node, record, action, f"cannot read who holds the node: {exc}", now)
            return
        if not hold.out:
            self.log.move(node, (VERIFYING,), IN_SERVICE, "already back in service (returned "
                          "by someone else): nothing to do", VIGIL, now,
                          probation_until=now + self.cfg.repair_probation_seconds)
            return
        if not hold.by_vigil:
            self.audit(action, "skipped", f"held out by someone else ({hold.reason}): "
                       "Vigil returns only what it took out", now)
            self._hold(node, f"held out by someone else ({hold.reason}); left as it is", now)
            return
        self.r.zremrangebyscore(self.returns_key, 0, now - 3600)
        if self.r.zcard(self.returns_key) >= self.cfg.repair_max_returns_per_hour:
            self._defer(node, record, action, f"{self.cfg.repair_max_returns_per_hour} "
                        "returns in the last hour", now)
            return
        lock = self.r.lock(f"{self.lock_base}:{node}", timeout=300)
        if not lock.acquire(blocking=False):
            self._defer(node, record, action, "another action holds the node's lock", now)
            return
        try:
            done = self.executor.release(node)
        except ExecutorError as exc:
            self._defer(node, record, action, f"return failed: {exc}", now)
            return
        finally:
            try:
                lock.release()
            except redis.exceptions.LockError:
                pass
        self.r.zadd(self.returns_key, {f"{node}|{now}": now})
        self.audit(action, "executed", done, now)
        out_seconds = now - float(record.get("out_at") or now)
        self.log.observe_return(out_seconds, gpu_hours(record, now))
        self.log.move(node, (VERIFYING,), IN_SERVICE,
                      f"verified (check exit {record.get('check_rc')}, "
                      f"{self.cfg.repair_evidence_seconds:g}s without a health detection) "
                      f"and returned: {done}", VIGIL, now,
                      probation_until=now + self.cfg.repair_probation_seconds,
                      probation=self.cfg.repair_probation_seconds)

    def _defer(self, node: str, record: dict[str, str], action: Action, why: str,
               now: float) -> None:
        """Not returned this tick; audited once per distinct reason, retried later."""
        if record.get("deferred") != why:
            self.r.hset(self.log.node_key(node), "deferred", why)
            self.audit(action, "skipped", why, now)

    def _hold(self, node: str, why: str, now: float) -> None:
        self.log.move(node, (VERIFYING, OUT, AWAITING), HELD, f"{why}: a person decides",
                      VIGIL, now)
        self._tell(node, why, now)

    def _probation_failed(self, node: str, record: dict[str, str], det: Detection,
                          now: float) -> None:
        """The same fault came back: take the node out again and hand it to a person."""
        action = self._action(node, record, "hold_out", now)
        action["incident"], action["summary"], action["gpu"] = (
            det["id"], det["summary"], det["gpu"])
        try:
            done = self.executor.execute(action)
            self.audit(action, "executed", done, now)
        except ExecutorError as exc:
            self.audit(action, "failed", str(exc), now)
        self.log.move(node, (IN_SERVICE,), HELD, f"the same fault ({record.get('fault')}) came "
                      "back during probation: a person decides", VIGIL, now,
                      incident=det["id"], out_at=now, probation_until=None)
        self._tell(node, f"{det['kind']} again within probation: {det['summary']}", now, det)

    def _tell(self, node: str, why: str, now: float, det: Detection | None = None) -> None:
        """Held out: the channels say so (critical, a person decides)."""
        if self.escalate is None:
            return
        record = self.log.record(node)
        self.escalate({
            "schema": "vigil.detection/1", "id": f"repair-{node}-{int(now)}-held",
            "kind": det["kind"] if det else "gpu_health", "state": "firing",
            "severity": "critical", "job": record.get("job") or "-", "node": node,
            "gpu": record.get("gpu") or None, "started_at": now, "detected_at": now,
            "metrics": [], "score": 0.0,
            "summary": f"Vigil holds {node} out of service: {why}. A person decides "
                       f"(`vigil repair done {node}` once fixed).",
            "evidence": {"repair_state": HELD}})

    def _action(self, node: str, record: dict[str, str], kind: str, now: float) -> Action:
        return {"id": f"{kind}-{node}-{int(now)}", "action": kind,
                "job": record.get("job") or "-", "node": node,
                "gpu": record.get("gpu") or None, "incident": record.get("incident", ""),
                "summary": record.get("summary", ""), "job_nodes": 0, "planned_at": now,
                "due_at": now}
