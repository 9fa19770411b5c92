"""`vigil worker`: run the Faust app until SIGTERM/SIGINT, with /metrics."""

from __future__ import annotations

import gc
import logging
import os
import threading
from pathlib import Path

import faust
from prometheus_client import start_http_server

from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.streams.app import build_app
from vigil_gpu_monitor.streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)
EXIT_STOP_DEADLINE = 3  # the exit status of a worker that had to be stopped hard


def _exit_hard(deadline: float) -> None:
    log.error("the worker did not stop within %.0f s of the stop signal; exiting now. "
              "Nothing is lost: its partitions restart from the last committed offset "
              "and checkpoint, and detections since then may be sent again", deadline)
    logging.shutdown()
    os._exit(EXIT_STOP_DEADLINE)


class _DeadlinedWorker(faust.Worker):
    """Faust's worker with a stop deadline. Faust's shutdown can hang for good (faust
    issue 484; seen here when two workers stop together mid-rebalance), and an
    orchestrator would then kill it without a word after its grace period. Past
    ``stop_seconds`` this worker says why and exits non-zero itself."""

    stop_seconds: float = 25.0

    async def on_stop(self) -> None:
        timer = threading.Timer(self.stop_seconds, _exit_hard, args=(self.stop_seconds,))
        timer.daemon = True  # a clean stop ends the process before it fires
        timer.start()
        await super().on_stop()


def _freeze_startup_heap() -> None:
    """Move every object alive now (modules, Faust, aiokafka, numpy: ~90,000 objects)
    out of the garbage collector's sight. They live as long as the process, yet each
    full collection walked them all: 0.42 s of GC in the oldest generation per
    28,800 samples, 0.14 s after the freeze (bench/RESULTS.md, "Issue #18, third
    session"). Reference counting still frees them; a reference cycle among them
    that became garbage later would stay (bounded: nothing is frozen after startup)."""
    gc.collect()
    gc.freeze()


def run_worker(cfg: Config, replication_factor: int = 1, stage: int = 0) -> int:
    """Start the worker in this process; returns when Faust shuts down. Faust creates
    its changelog topics with ``replication_factor`` replicas (what Vigil's own topics
    got from ``vigil.ops.kafka_admin.ensure_topics``). ``stage``: 0 the one-stage
    worker, 1 or 2 a stage of sharded detection (``streams.stage_app``)."""
    Path(cfg.worker.data_dir).mkdir(parents=True, exist_ok=True)
    metrics = WorkerMetrics()
    if cfg.worker.web_port:
        start_http_server(cfg.worker.web_port, addr=cfg.worker.metrics_bind,
                          registry=metrics.registry)
        log.info("metrics on http://%s:%d/metrics", cfg.worker.metrics_bind,
                 cfg.worker.web_port)
    if stage:
        from vigil_gpu_monitor.streams.stage_app import build_stage_app

        app = build_stage_app(cfg, stage, metrics, replication_factor)
    else:
        app = build_app(cfg, metrics, replication_factor)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    worker = _DeadlinedWorker(app, loglevel=level, quiet=True)
    worker.stop_seconds = cfg.worker.stop_seconds
    _freeze_startup_heap()
    worker.execute_from_commandline()
    return 0
