"""Reaching the services a command needs, or saying at once that it cannot.

A command a person runs must not wait half a minute on a client library's retries, nor
read an empty answer from a store that is down as "nothing there": it checks first and
fails with one line (``ServiceDown``) that names the service and the fix.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import VigilError

if TYPE_CHECKING:
    import redis

CONNECT_SECONDS = 3.0


class ServiceDown(VigilError):
    """Kafka or Redis does not answer."""


def redis_client(cfg: Config) -> redis.Redis:
    """A Redis client that has answered a PING (so a read that finds nothing means
    nothing is there, not that Redis is away)."""
    import redis

    client = redis.Redis.from_url(cfg.redis_url, socket_connect_timeout=CONNECT_SECONDS,
                                  socket_timeout=30.0)
    client.ping()  # a connection error is told by vigil.failures
    return client


def require_kafka(cfg: Config, timeout: float = CONNECT_SECONDS) -> None:
    """Raise ``ServiceDown`` unless a bootstrap server accepts a TCP connection (a
    Kafka client would otherwise retry for tens of seconds before saying so)."""
    for server in cfg.kafka_bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except (OSError, ValueError):
            continue
    where = "the local Kafka" if cfg.manages_kafka else "Kafka"
    raise ServiceDown(f"{where} ({cfg.kafka_bootstrap}) is not reachable: no bootstrap "
                      "server accepts a connection",
                      fix="start it with `vigil up`, or set VIGIL_KAFKA_BOOTSTRAP")
