"""`vigil worker` whose Faust consumer jumps ahead once, over a block of samples.

That is what faust-streaming does in some rebalances (a fetched block skipped and
acknowledged, the re-fetch dropped). Run by `test_worker.py` as
``python -m tests.integration.jumping_worker SKIP`` (jump SKIP samples ahead once the
first batch was processed) or ``... end`` (jump to the partition's end before anything
was processed: no message of it ever reaches the agent); prints ``JUMPED``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import faust
from prometheus_client import start_http_server

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.streams.app import build_app
from vigil_gpu_monitor.streams.metrics import WorkerMetrics


def main() -> None:
    to_end = sys.argv[1] == "end"
    skip = 0 if to_end else int(sys.argv[1])
    cfg = load()
    Path(cfg.worker.data_dir).mkdir(parents=True, exist_ok=True)  # as streams.worker does
    metrics = WorkerMetrics()
    start_http_server(cfg.worker.web_port, addr="127.0.0.1", registry=metrics.registry)
    app = build_app(cfg, metrics)
    samples = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
    jumped = {"done": False}

    @app.timer(interval=0.05)
    async def jump_ahead() -> None:
        processed = metrics.registry.get_sample_value("vigil_worker_samples_total") or 0
        if jumped["done"] or (processed < 1 and not to_end):
            return
        for tp in app.consumer.assignment():
            position = await app.consumer.position(tp) if tp.topic == samples else None
            high = app.consumer.highwater(tp) if position is not None else None
            if position is None or not high or high - position <= skip + 50:
                continue
            target = high if to_end else position + skip
            await app.consumer.seek_wait({tp: target})
            jumped["done"] = True
            print(f"JUMPED partition {tp.partition} {position} -> {target}", flush=True)
            return

    faust.Worker(app, loglevel="info", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
