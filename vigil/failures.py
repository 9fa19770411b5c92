"""The command line's one error path: every failure a user can cause or meet (a service
down, a file missing or unreadable, a setting out of range, a driver absent) becomes one
line that names the problem and its fix; anything else is a bug, and says so.

Client libraries' exceptions are recognised by their class names and modules, so this
module imports none of them (a node agent's install has no Redis client, a report's
none of NVML).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ConfigError, VigilError

# command → the extra that brings its dependencies (pyproject.toml)
EXTRA_OF = {"agent": "agent", "worker": "worker", "alerter": "alerter", "alerts": "alerter",
            "top": "alerter", "silence": "alerter", "ack": "alerter", "actions": "alerter",
            "nodes": "alerter", "repair": "alerter", "goodput": "alerter"}
# Vigil's import name, and the logger some modules name "vigil"
OWN_PACKAGES = ("vigil_gpu_monitor", "vigil")
DIST = "vigil-gpu-monitor"


@dataclass(frozen=True)
class Failure:
    """What the user reads: the problem, its fix, and whether it is a bug of Vigil's."""

    problem: str
    fix: str = ""
    bug: bool = False

    def line(self) -> str:
        """One line, whatever newlines the underlying messages carried."""
        text = self.problem + (f" (fix: {self.fix})" if self.fix else "")
        return "vigil: error: " + " ".join(text.split())


def _names(exc: BaseException) -> set[str]:
    """``module.Class`` of every class the exception is an instance of."""
    return {f"{k.__module__}.{k.__name__}" for k in type(exc).__mro__}


def _redis_where(cfg: Config | None) -> str:
    if cfg is None:
        return "Redis"
    if cfg.manages_redis:
        return f"the local Redis (127.0.0.1:{cfg.local.redis_port})"
    from urllib.parse import urlsplit
    parts = urlsplit(cfg.redis_url)
    return f"Redis at {parts.hostname}:{parts.port or 6379}"


def _kafka_where(cfg: Config | None) -> str:
    if cfg is None:
        return "Kafka"
    return ("the local Kafka" if cfg.manages_kafka else "Kafka") + f" ({cfg.kafka_bootstrap})"


def _os_error(exc: OSError) -> Failure | None:
    name = exc.filename
    if name is None:
        return None
    what = exc.strerror or type(exc).__name__
    if exc.errno == errno.ENOENT:
        return Failure(f"{name}: no such file or directory", "check the path")
    if exc.errno == errno.EISDIR:
        return Failure(f"{name} is a directory", "name a file")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return Failure(f"{name}: permission denied", "check the file's permissions")
    if exc.errno == errno.ENOTDIR:
        return Failure(f"{name}: a part of the path is not a directory", "check the path")
    return Failure(f"{name}: {what}")


def _default_fix(exc: VigilError) -> str:
    """The fix of an error raised without one, by its kind."""
    if isinstance(exc, ConfigError):
        return "correct it in the config file or its VIGIL_* variable; `vigil config` lists " \
            "every setting"
    if type(exc).__name__ == "StackError":
        return "`vigil status` shows the local stack; its logs are under local.data_dir"
    return ""


def describe(exc: BaseException, command: str, cfg: Config | None) -> Failure:
    """The failure the user reads for ``exc`` raised while running ``vigil command``."""
    names = _names(exc)
    if isinstance(exc, VigilError):
        return Failure(str(exc), exc.fix or _default_fix(exc))
    if isinstance(exc, ModuleNotFoundError):
        if (exc.name or "").split(".")[0] in OWN_PACKAGES:
            return Failure(f"{exc}", bug=True)
        extra = EXTRA_OF.get(command, "report")
        return Failure(f"`vigil {command}` needs {exc.name!r}, which this install lacks",
                       f"pip install '{DIST}[{extra}]'")
    if any(n.startswith("redis.exceptions.") for n in names):
        if "redis.exceptions.AuthenticationError" in names or \
                "redis.exceptions.AuthenticationWrongNumberOfArgsError" in names:
            return Failure(f"{_redis_where(cfg)} refused Vigil's credentials ({exc})",
                           "check the user and password in VIGIL_REDIS_URL")
        if names & {"redis.exceptions.ConnectionError", "redis.exceptions.TimeoutError"}:
            return Failure(f"{_redis_where(cfg)} is not reachable, so nothing could be read "
                           "or changed", "start it with `vigil up`, or set VIGIL_REDIS_URL")
        return Failure(f"Redis answered with an error: {exc}")
    if any(n.startswith("kafka.errors.") for n in names):
        if names & {"kafka.errors.NoBrokersAvailable", "kafka.errors.KafkaConnectionError",
                    "kafka.errors.KafkaTimeoutError"}:
            return Failure(f"{_kafka_where(cfg)} is not reachable",
                           "start it with `vigil up`, or set VIGIL_KAFKA_BOOTSTRAP")
        return Failure(f"Kafka answered with an error: {type(exc).__name__}: {exc}")
    if any(n.startswith("pynvml.NVMLError") for n in names):
        return Failure(f"NVML, the NVIDIA driver's library, cannot be used here: {exc}",
                       "run the agent on a node with the NVIDIA driver, or choose other "
                       "sources (--sources dcgm,infiniband,host)")
    if isinstance(exc, OSError):
        found = _os_error(exc)
        if found is not None:
            return found
        if isinstance(exc, ConnectionError):
            return Failure(f"a connection failed: {exc}", "check that the service is up")
    if isinstance(exc, MemoryError):
        return Failure("out of memory", "give the command more memory or less input")
    return Failure(f"{type(exc).__name__}: {exc}",
                   "this is a bug in Vigil: rerun with --debug and report the traceback",
                   bug=True)
