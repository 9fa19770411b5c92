"""The ranges settings must fall in, checked when the configuration is read.

A setting of the right type but out of range (a zero bin, a NaN timer, a negative
window, a URL that does not parse) would otherwise divide by zero, raise deep inside a
detector, or worse, run and answer wrongly. Every number must be finite; the default
range is ``>= 0`` (0 turns a feature off where a field's comment says so); the tables
below name what must be positive, a share, or a port. Kept apart from ``config.py``'s
dataclasses so that adding a setting there needs no change here unless its range is
special.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from urllib.parse import urlsplit

from vigil_gpu_monitor.contracts.errors import ConfigError
from vigil_gpu_monitor.contracts.shards import MAX_SHARD_NODES, MIN_SHARD_NODES

POSITIVE = frozenset({
    "kafka.samples_partitions", "kafka.detections_partitions", "kafka.summaries_partitions",
    "kafka.samples_retention_hours",
    "redis.history_max", "local.kafka_heap_mb",
    "worker.session_timeout_seconds", "worker.checkpoint_steps", "worker.batch_size",
    "worker.batch_seconds", "worker.stop_seconds",
    "detect.bin_seconds", "detect.window_seconds", "detect.held_seconds", "detect.fire_after",
    "detect.resolve_after", "detect.straggler_false_alarms_per_1000_days",
    "detect.hang_seconds", "detect.silent_seconds", "detect.missing_gpu_seconds",
    "detect.throttle_seconds", "detect.link_z", "detect.ib_errors_per_window",
    "alerter.slack_rate_per_second", "alerter.pagerduty_rate_per_second",
    "alerter.resend_seconds", "alerter.flap_max", "alerter.flap_window_seconds",
    "alerter.max_attempts", "alerter.give_up_after_seconds",
    "alerter.repair_check_timeout_seconds", "alerter.repeat_offender_count",
    "alerter.gpus_per_node",
    "agent.base_interval", "agent.max_interval", "agent.peak_change", "agent.density_band",
    "agent.buffer_capacity", "agent.spool_max_mb",
})
SHARES = frozenset({"detect.network_link_share", "alerter.max_job_share",
                    "alerter.max_fleet_share", "agent.density_min"})  # in (0, 1]
PORTS = frozenset({"local.kafka_port", "local.controller_port", "local.redis_port",
                   "local.slurmctld_port", "local.slurmd_port", "worker.web_port",
                   "alerter.metrics_port", "agent.metrics_port"})  # 0 = off where allowed
HTTP_URLS = frozenset({"alerter.alertmanager_url", "alerter.pagerduty_url",
                       "alerter.webhook_url", "alerter.kubernetes_api", "agent.dcgm_url",
                       "alerter.slack_webhook"})
REDIS_SCHEMES = ("redis", "rediss", "unix")


def hide_password(url: str) -> str:
    """The URL with its password, and nothing else, as ``***`` (a Redis URL's host,
    database and options are what an operator checks; its password is a secret)."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return "***"
    if password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return parts._replace(netloc=f"{name}:***@{host}").geturl()


def _env(key: str) -> str:
    return "VIGIL_" + key.replace(".", "_").upper()


def _refuse(key: str, value: object, why: str) -> ConfigError:
    section, _, name = key.partition(".")
    return ConfigError(f"{key} = {value!r} {why}",
                       fix=f"set {_env(key)} or `{name}` under [{section}] in the config file")


def _number(key: str, value: float) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise _refuse(key, value, "is not a finite number")
    if key in SHARES and not 0 < value <= 1:
        raise _refuse(key, value, "must be a share in (0, 1]")
    if key in PORTS and not 0 <= value <= 65535:
        raise _refuse(key, value, "is not a port (0-65535)")
    if key in POSITIVE and not value > 0:
        raise _refuse(key, value, "must be greater than 0")
    if value < 0:
        raise _refuse(key, value, "must not be negative")


def _url(key: str, url: str, schemes: tuple[str, ...], shown: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise _refuse(key, shown, f"is not a URL ({exc})") from None
    if parts.scheme not in schemes or (parts.scheme != "unix" and not parts.hostname):
        raise _refuse(key, shown, f"is not a {'/'.join(schemes)}:// URL with a host")


def _bootstrap(value: str) -> None:
    for server in value.split(","):
        host, _, port = server.strip().rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _refuse("kafka.bootstrap", value, "is not a comma list of host:port")


def check(config: Any) -> None:
    """Raise ``ConfigError`` (naming the setting, the range and how to set it) for the
    first setting of ``config`` (a ``contracts.config.Config``) out of its range."""
    for section in dataclasses.fields(config):
        values = getattr(config, section.name)
        for f in dataclasses.fields(values):
            key, value = f"{section.name}.{f.name}", getattr(values, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                _number(key, value)
            elif key in HTTP_URLS and value:
                text = value if isinstance(value, str) else value.reveal()
                _url(key, text, ("http", "https"), text if isinstance(value, str) else "***")
    if config.redis.url is not None:
        url = config.redis.url.reveal()
        _url("redis.url", url, REDIS_SCHEMES, hide_password(url))
    if config.kafka.bootstrap:
        _bootstrap(config.kafka.bootstrap)
    if config.detect.window_seconds < config.detect.bin_seconds:
        raise _refuse("detect.window_seconds", config.detect.window_seconds,
                      f"is shorter than detect.bin_seconds ({config.detect.bin_seconds:g})")
    if not MIN_SHARD_NODES <= config.detect.shard_nodes <= MAX_SHARD_NODES:
        raise _refuse("detect.shard_nodes", config.detect.shard_nodes,
                      f"must be {MIN_SHARD_NODES}-{MAX_SHARD_NODES} nodes a shard")
    if config.agent.max_interval < config.agent.base_interval:
        raise _refuse("agent.max_interval", config.agent.max_interval,
                      f"is shorter than agent.base_interval ({config.agent.base_interval:g})")
