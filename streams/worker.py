"""`vigil worker`: run the Faust app until SIGTERM/SIGINT, with /metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import faust
from prometheus_client import start_http_server

from contracts.config import Config
from streams.app import build_app
from streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)


def run_worker(cfg: Config, replication_factor: int = 1) -> int:
    """Start the worker in this process; returns when Faust shuts down. Faust creates
    its changelog topics with ``replication_factor`` replicas (what Vigil's own topics
    got from ``vigil.ops.kafka_admin.ensure_topics``)."""
    Path(cfg.worker.data_dir).mkdir(parents=True, exist_ok=True)
    metrics = WorkerMetrics()
    if cfg.worker.web_port:
        start_http_server(cfg.worker.web_port, addr=cfg.worker.metrics_bind,
                          registry=metrics.registry)
        log.info("metrics on http://%s:%d/metrics", cfg.worker.metrics_bind,
                 cfg.worker.web_port)
    app = build_app(cfg, metrics, replication_factor)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    worker = faust.Worker(app, loglevel=level, quiet=True)
    worker.execute_from_commandline()
    return 0
