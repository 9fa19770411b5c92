"""Remediation triggers, guarded: detections → actions → rails → executor or not.

Policy (which detection asks for what):
- ``gpu_health`` whose cause says replace (XID 48, 64, 79, 95, 140, double-bit ECC)
  → ``drain_and_replace``; cause says reset (XID 62, 74, 94, 119, 120) → ``reset_gpu``.
- ``straggler`` still firing ``straggler_cordon_after_seconds`` after it fired → ``cordon``;
  with ``straggler_cordon_gpu_hours_per_hour`` > 0, only if its estimated cost
  (``evidence.gpu_hours_lost_per_hour``) is at least that much.

Actions that fall due together are decided costliest first, so when a rail (the
hourly budget, the fleet's or a job's share) leaves room for only some, the node
that wastes the most GPU time is the one acted on. Every audit record carries the
estimate behind it.

Rails, in order; the first that says no decides, and every decision is audited (a
Redis stream and the ``vigil.actions`` topic): the nodes the action would touch
(exactly one host name, never a host list: ``nodes_touched``); opt-out list; repeat offender (a
person decides: escalate); node cooldown; per-node lock; at most K actions an hour;
at most P% of the job's nodes (but always one) and of the fleet's within the
cooldown; then a dry
run (the default) or the executor. An action waits ``confirm_seconds`` and is
dropped if its incident resolved meanwhile. Before executing, a node that a person or
another tool already holds out is left as it is (its drain reason or taint says
who), and a node Vigil already holds out gets no second action.

An executed action hands the node to the repair loop (``alerting.repair``), which
verifies it and brings it back, or holds it out with a reason.

Detections of kind ``load_imbalance`` (severity info, for the job's owner) and
``slowdown`` (the whole job, no node) never ask for an action.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
import time
import uuid
from collections.abc import Callable

import redis
from redis.exceptions import LockError

from vigil_gpu_monitor.alerting.cost import lost_per_hour
from vigil_gpu_monitor.alerting.executors import Executor, ExecutorError, Returner
from vigil_gpu_monitor.alerting.repair import RepairLoop
from vigil_gpu_monitor.contracts.config import AlerterConfig
from vigil_gpu_monitor.contracts.messages import Action, Detection
from vigil_gpu_monitor.contracts.names import is_node_name

log = logging.getLogger(__name__)
WEEK = 7 * 86400.0
LOCK_SECONDS = 300  # a node's lock expires on its own if its holder dies mid-action


NEVER_ACTED_ON = ("load_imbalance", "slowdown")  # a job's owner acts on these, not Vigil


def plan(det: Detection, cfg: AlerterConfig) -> tuple[str, float] | None:
    """(action, seconds to wait after firing) a firing detection asks for, if any."""
    if det["state"] != "firing" or det["node"] is None or det["kind"] in NEVER_ACTED_ON:
        return None
    if det["kind"] == "gpu_health":
        cause = det["evidence"].get("action")
        if cause == "replace" or det["evidence"].get("metric") == "ecc_dbe":
            return "drain_and_replace", cfg.confirm_seconds
        if cause == "reset":
            return "reset_gpu", cfg.confirm_seconds
    # a straggler nothing but busy time speaks for (no work counter, no clock
    # signature) cannot be told from more work: never acted on automatically;
    # load_imbalance and slowdown are the job's own, never the hardware's
    if det["kind"] == "straggler" and det["evidence"].get("remediable", True):
        return "cordon", max(cfg.confirm_seconds, cfg.straggler_cordon_after_seconds)
    return None


_RANGE = re.compile(r"\[([^\[\]]*)\]")


def nodes_touched(node: str) -> int | None:
    """How many machines an action on ``node`` would act on: 1 for one host name
    (``contracts.names``), the size of the expansion for a Slurm host list
    (``gpu-[01-04],cpu-1`` → 5), None when it cannot be told (``ALL``, anything
    else). The rails count this, not one per action."""
    if is_node_name(node):
        return 1
    if node.strip().lower() in ("all", "default"):
        return None
    total = 0
    for part in re.split(r",(?![^\[]*\])", node):  # commas outside brackets
        if not re.fullmatch(r"[A-Za-z0-9.-]+", _RANGE.sub("0", part)):
            return None  # whitespace, a path, an option: not a host list either
        count = 1
        for ranges in _RANGE.findall(part):
            width = 0
            for item in ranges.split(","):
                low, _, high = item.partition("-")
                if not low.strip().isdigit() or (high and not high.strip().isdigit()):
                    return None
                width += int(high) - int(low) + 1 if high else 1
            count *= max(width, 0)
        total += count
    return total


class Remediator:
    """Holds planned actions until due, applies the rails, executes or records why not."""

    def __init__(self, cfg: AlerterConfig, r: redis.Redis, prefix: str, executor: Executor,
                 is_open: Callable[[Detection], bool],
                 publish: Callable[[Action], None] | None = None,
                 escalate: Callable[[Detection], None] | None = None,
                 open_on_node: Callable[[str], list[Detection]] | None = None) -> None:
        self.cfg = cfg
        self.r = r
        self.base = f"{prefix}:remediation{':dry' if cfg.remediation_dry_run else ''}"
        self.audit_key = f"{prefix}:actions"
        self.executor = executor
        self.is_open = is_open
        self.publish = publish
        self.escalate = escalate
        self.pending: dict[str, tuple[Action, Detection]] = {}  # incident → planned
        self.opt_out = [p.strip() for p in cfg.opt_out.split(",") if p.strip()]
        self.repair = RepairLoop(cfg, r, prefix, executor, open_on_node or (lambda node: []),
                                 self._audit, escalate) if isinstance(executor, Returner) \
            else None

    def consider(self, det: Detection, now: float | None = None) -> None:
        """A detection was applied: plan an action, or cancel one whose incident resolved."""
        now = time.time() if now is None else now
        if det["state"] == "resolved":
            planned_before = self.pending.pop(det["id"], None)
            if planned_before:
                self._audit(planned_before[0], "skipped",
                            "incident resolved before confirmation", now)
            return
        if self.repair is not None and self.repair.on_detection(det, now) is not None:
            return  # Vigil holds the node out already: its repair loop owns it
        planned, node = plan(det, self.cfg), det["node"]
        if planned is None or node is None or det["id"] in self.pending:
            return  # (plan() asks nothing of a job-level detection)
        kind, wait = planned
        action: Action = {
            "id": uuid.uuid5(uuid.NAMESPACE_URL, f"{det['id']}|{kind}").hex[:16],
            "action": kind, "job": det["job"], "node": node, "gpu": det["gpu"],
            "incident": det["id"], "summary": det["summary"],
            "job_nodes": int(det["evidence"].get("job_nodes") or 0),
            "planned_at": now, "due_at": now + wait,
            "job_slowdown": det["evidence"].get("job_slowdown"),
            "gpu_hours_lost_per_hour": lost_per_hour(det)}
        self.pending[det["id"]] = (action, det)

    def tick(self, now: float | None = None) -> list[Action]:
        """Decide every action that is due; returns the audit records written."""
        now = time.time() if now is None else now
        done = []
        due = [(incident, action, det) for incident, (action, det) in self.pending.items()
               if action["due_at"] <= now]
        for incident, action, det in sorted(due, key=lambda d: (
                -(d[1].get("gpu_hours_lost_per_hour") or 0.0), d[1]["due_at"])):
            del self.pending[incident]
            if not self.is_open(det):
                done.append(self._audit(action, "skipped", "incident no longer open", now))
                continue
            floor = self.cfg.straggler_cordon_gpu_hours_per_hour
            cost = action.get("gpu_hours_lost_per_hour")
            if action["action"] == "cordon" and floor > 0 and (cost is None or cost < floor):
                done.append(self._audit(
                    action, "skipped", f"costs {'an unknown amount' if cost is None else cost}"
                    f" GPU-hours per hour, under the cordon threshold of {floor}", now))
                continue
            done.append(self._decide(action, det, now))
        if self.repair is not None:
            self.repair.tick(now)
        return done

    def _decide(self, action: Action, det: Detection, now: float) -> Action:
        cfg, node, job = self.cfg, action["node"], action["job"]
        touched = nodes_touched(node)
        if touched != 1 or not is_node_name(node):  # a host list, ALL, a path
            count = "an unknown number of" if touched is None else str(touched)
            return self._audit(action, "skipped", f"node name {node!r} is not one host "
                               f"name: it would touch {count} nodes", now)
        if any(fnmatch.fnmatchcase(node, p) or fnmatch.fnmatchcase(job, p)
               for p in self.opt_out):
            return self._audit(action, "skipped", "node or job is on the opt-out list", now)
        history = f"{self.base}:history:{node}"
        self.r.zremrangebyscore(history, 0, now - WEEK)
        if self.r.zcard(history) >= cfg.repeat_offender_count:
            record = self._audit(action, "escalated", f"{node} was acted on "
                                 f"{self.r.zcard(history)} times this week: a person decides",
                                 now)
            if self.escalate is not None:
                self.escalate(escalation(det, record))
            return record
        recent = f"{self.base}:recent"
        self.r.zremrangebyscore(recent, 0, now - cfg.node_cooldown_seconds)
        members = [m.decode() for m in self.r.zrange(recent, 0, -1)]  # type: ignore[union-attr]
        if any(m.split("|", 1)[1] == node for m in members):
            return self._audit(action, "skipped", "node is in its cooldown", now)
        # redis-py's Lock: its release deletes the key only if it still holds our token,
        # so an action that outlived the lock's expiry cannot free another's lock
        lock = self.r.lock(f"{self.base}:lock:{node}", timeout=LOCK_SECONDS)
        if not lock.acquire(blocking=False):
            return self._audit(action, "skipped", "another action holds the node's lock", now)
        try:
            if self.r.zcount(recent, now - 3600, "+inf") >= cfg.max_actions_per_hour:
                return self._audit(action, "skipped",
                                   f"{cfg.max_actions_per_hour} actions in the last hour", now)
            in_job = {m.split("|", 1)[1] for m in members if m.split("|", 1)[0] == job}
            # one node of any job is always allowed: a small job with a dead GPU is
            # already broken; the rail keeps a big job from losing many nodes at once
            job_cap = max(1, int(cfg.max_job_share * action["job_nodes"]))
            if len(in_job) + 1 > job_cap:
                return self._audit(action, "skipped", f"would exceed {cfg.max_job_share:.0%} "
                                   f"of job {job}'s {action['job_nodes']} nodes", now)
            fleet = {m.split("|", 1)[1] for m in members}
            fleet_cap = int(cfg.max_fleet_share * cfg.fleet_nodes) if cfg.fleet_nodes else 1
            if len(fleet) + 1 > max(fleet_cap, 1):
                return self._audit(action, "skipped", f"would exceed {cfg.max_fleet_share:.0%} "
                                   f"of the fleet ({len(fleet)} nodes acted on)", now)
            self.r.zadd(recent, {f"{job}|{node}": now})
            self.r.zadd(history, {action["id"]: now})
            if cfg.remediation_dry_run:
                return self._audit(action, "dry_run", "dry run: would have executed", now)
            try:
                if isinstance(self.executor, Returner):
                    hold = self.executor.holder(node)
                    if hold.out and not hold.by_vigil:
                        return self._audit(action, "skipped", f"already held out by someone "
                                           f"else ({hold.reason}): left as it is", now)
                result = self.executor.execute(action)
            except ExecutorError as exc:
                return self._audit(action, "failed", str(exc), now)
            record = self._audit(action, "executed", result, now)
            if self.repair is not None:
                self.repair.taken_out(action, det, now)
            return record
        finally:
            try:
                lock.release()
            except LockError:
                log.warning("remediation lock of %s expired while %s ran (over %d s); "
                            "left to its new holder", node, action["id"], LOCK_SECONDS)

    def _audit(self, action: Action, decision: str, why: str, now: float) -> Action:
        record: Action = {**action, "decision": decision, "why": why, "decided_at": now,
                          "executor": self.executor.name,
                          "dry_run": self.cfg.remediation_dry_run}
        self.r.xadd(self.audit_key, {"record": json.dumps(record, separators=(",", ":"))},
                    maxlen=10000, approximate=True)
        if self.publish is not None:
            self.publish(record)
        log.info("remediation %s %s on %s: %s", decision, action["action"], action["node"], why)
        return record


def escalation(det: Detection, record: Action) -> Detection:
    """A critical notification for people: the automation stepped back on this node."""
    return {**det, "id": f"{det['id']}-escalated", "severity": "critical", "state": "firing",
            "summary": f"Repeat offender {det['node']}: Vigil did not {record['action']} "
                       f"it again ({record['why']}). Original: {det['summary']}"}


def audit_log(r: redis.Redis, prefix: str, count: int = 100) -> list[Action]:
    """The latest remediation decisions, newest first."""
    entries: list[tuple[bytes, dict[bytes, bytes]]] = r.xrevrange(  # type: ignore[assignment]
        f"{prefix}:actions", count=count)
    return [json.loads(f[b"record"]) for _, f in entries]
