"""`vigil worker`: run the Faust app until SIGTERM/SIGINT."""

from __future__ import annotations

import logging
from pathlib import Path

import faust

from contracts.config import Config
from streams.app import build_app


def run_worker(cfg: Config) -> int:
    """Start the worker in this process; returns when Faust shuts down."""
    Path(cfg.worker.data_dir).mkdir(parents=True, exist_ok=True)
    app = build_app(cfg)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    worker = faust.Worker(app, loglevel=level, quiet=True)
    worker.execute_from_commandline()
    return 0
