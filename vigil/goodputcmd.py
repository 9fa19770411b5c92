"""``vigil goodput [--since 7d] [--job J] [--json]``: what faults cost, from the ledger.

Reads the goodput ledger (``alerting/goodput.py``) in Redis: GPU-hours lost over the
range, by day, ISO week, finding kind, source (timings, counters, lifecycle), job,
node and GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import time

from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ConfigError

_UNITS = {"m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def parse_since(text: str, now: float) -> float:
    """``7d``, ``12h``, ``30m``, ``2w`` back from now, or Unix seconds."""
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([mhdw])", text.strip())
    if found:
        return now - float(found.group(1)) * _UNITS[found.group(2)]
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--since {text!r}: give 30m, 12h, 7d, 2w or Unix seconds") from None


def render(report: dict[str, object], top: int = 10) -> str:
    """The summary as text a person reads."""
    lines = [f"GPU-hours lost: {report['total']:.1f}"
             + (f" (job {report['for_job']})" if report.get("for_job") else " (fleet)")]
    for section in ("week", "day", "kind", "source", "job", "node", "gpu"):
        values = report.get(section)
        if not isinstance(values, dict) or not values:
            continue
        rows = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
        if section in ("day", "week"):
            rows = sorted(values.items())
        lines.append(f"by {section}:")
        lines.extend(f"  {name:<32} {hours:10.2f}" for name, hours in rows[:top])
    return "\n".join(lines)


def goodput(cfg: Config, args: argparse.Namespace) -> int:
    """Print the ledger's summary (``--json``: the whole summary as JSON)."""
    import redis

    from vigil_gpu_monitor.alerting.goodput import GoodputLedger

    now = time.time()
    since = parse_since(args.since, now)
    ledger = GoodputLedger(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    try:
        report = ledger.summary(since, now, args.job)
    except redis.RedisError as exc:
        raise ConfigError(f"goodput: Redis at {cfg.redis_url} did not answer: {exc}") from None
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0
