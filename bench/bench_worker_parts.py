"""Where a worker's time goes: our per-sample code alone, and Faust's floor.

    .venv/bin/python bench/bench_worker_parts.py compute      # no Kafka
    .venv/bin/vigil up && .venv/bin/python bench/bench_worker_parts.py faust-floor
    .venv/bin/vigil up && .venv/bin/python bench/bench_worker_parts.py faust-drain

``compute`` runs decode + validation + windowing + detectors over the same
20,480 node-samples `bench_worker.py` uses, in batches of 500, in one process.
``faust-floor`` runs a Faust app configured like the worker (same broker settings,
``take_events(500, 0.5)``, concurrency 1) whose handler does nothing but count:
the most a Faust agent can consume on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_worker import START, _cluster

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.simulator.cluster import Simulator

NODES, SECONDS, BATCH = 256, 150, 500


def compute() -> None:
    """Decode, validate, window and detect without Kafka."""
    from vigil_gpu_monitor.detectors.engine import JobEngine
    from vigil_gpu_monitor.streams.decode import decode_sample_fast

    cfg = load()
    raw = [encode_sample(s) for s in Simulator(_cluster(NODES), START, seed=1).samples(SECONDS)]
    engines: dict[str, JobEngine] = {}
    t0 = time.perf_counter()
    for i in range(0, len(raw), BATCH):
        by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in raw[i:i + BATCH]:
            sample = decode_sample_fast(r)
            by_job[sample["job"]].append(sample)
        for job, samples in by_job.items():
            engine = engines.get(job) or engines.setdefault(job, JobEngine(job, cfg.detect))
            for sample in sorted(samples, key=lambda s: s["ts"]):
                engine.ingest(sample)
            engine.advance()
    spent = time.perf_counter() - t0
    print(f"compute only: {len(raw) / spent:,.0f} node-messages/s "
          f"({spent / len(raw) * 1e6:.0f} µs each)")


def faust_floor(bypass: bool = False, topic: str = "", total: int = 0,
                monitor: str = "faust", settings: dict[str, Any] | None = None) -> None:
    """A no-op Faust agent over a pre-loaded samples topic (``topic`` holding ``total``
    samples, else one published here).

    With ``bypass`` the consumer's per-message callback is replaced, for the samples
    topic, by one that only counts: what is left is Faust's fetch-and-drain loop, the
    ceiling of a worker that skipped Faust's per-event stream.
    """
    import faust

    from vigil_gpu_monitor.producers.publisher import KafkaPublisher
    from vigil_gpu_monitor.streams.app import PerBatchMonitor
    from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

    tag = uuid.uuid4().hex[:6]
    cfg = load(env=dict(os.environ, VIGIL_KAFKA_TOPIC_PREFIX=f"floor{tag}."))
    name = topic
    if not topic:
        ensure_topics(cfg)
        name = topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix)
        pub = KafkaPublisher(cfg.kafka_bootstrap, name)
        for sample in Simulator(_cluster(NODES), START, seed=1).samples(SECONDS):
            pub.publish(sample)
        pub.close()
        total = pub.sent
    app = faust.App(f"floor-{tag}", broker=f"kafka://{cfg.kafka_bootstrap}", store="memory://",
                    datadir=f".vigil/bench-floor-{tag}", consumer_auto_offset_reset="earliest",
                    web_enabled=False, producer_acks=-1,
                    topic_partitions=cfg.kafka.samples_partitions,
                    Monitor=PerBatchMonitor if monitor == "per-batch" else faust.Monitor,
                    **(settings or {}))
    samples = app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw",
                        value_serializer="raw")
    seen = {"n": 0, "first": 0.0, "last": 0.0}
    label = "drain loop only (callback bypassed)" if bypass else "no-op handler"
    label += f", {monitor} monitor"

    def count_batch(n: int) -> bool:
        now = time.monotonic()
        seen["first"] = seen["first"] or now
        seen["n"] += n
        seen["last"] = now
        if seen["n"] < total:
            return False
        rate = (seen["n"] - BATCH) / max(1e-9, seen["last"] - seen["first"])
        print(f"faust floor ({label}): {rate:,.0f} node-messages/s", flush=True)
        return True

    @app.agent(samples, concurrency=1)
    async def count(stream: Any) -> None:
        async for events in stream.take_events(BATCH, within=0.5):
            if count_batch(len(events)):
                os._exit(0)  # the rate is printed; Faust's shutdown adds nothing to it

    if bypass:
        original = app.consumer.callback
        pending = {"n": 0}

        async def on_message(message: Any) -> None:
            if message.topic != name:
                return await original(message)
            pending["n"] += 1
            if pending["n"] == BATCH or seen["n"] + pending["n"] >= total:
                done = count_batch(pending["n"])
                pending["n"] = 0
                if done:
                    # Stopping Faust from inside its own drain loop waits on that loop;
                    # the measurement is printed, so leave without the shutdown.
                    os._exit(0)

        app.consumer.callback = on_message

    worker = faust.Worker(app, loglevel="warning", quiet=True)
    worker.execute_from_commandline()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=["compute", "faust-floor", "faust-drain"])
    parser.add_argument("--topic", default="", help="drain this pre-loaded topic")
    parser.add_argument("--total", type=int, default=0, help="samples it holds")
    parser.add_argument("--monitor", choices=["faust", "per-batch"], default="faust",
                        help="Faust's Monitor, or the worker's (no per-message bookkeeping)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=INT",
                        help="a Faust app setting, e.g. consumer_max_fetch_size=8388608")
    args = parser.parse_args()
    if args.what == "compute":
        compute()
    else:
        faust_floor(args.what == "faust-drain", args.topic, args.total, args.monitor,
                    {k: int(v) for k, v in (x.split("=", 1) for x in args.setting)})
