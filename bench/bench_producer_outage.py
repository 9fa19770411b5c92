"""A kafka-python producer across a broker outage longer than its delivery timeout:
how many of its records are still unanswered once the broker is back, with
kafka-python's defaults (idempotence on since 3.0) and with the settings Vigil's
producers start from (``contracts.config.KAFKA_PYTHON_PRODUCER``: idempotence off,
one request in flight a connection).

    env $PORTS .venv/bin/python bench/bench_producer_outage.py [--outage 45] [--wait 90]

Needs the local stack's broker (`vigil up`; ``$PORTS``: the ``VIGIL_LOCAL_*``
variables of the stack to use), which it stops and starts again. Each variant: a
producer with the agent's client settings sends a 200-byte record every 50 ms to a
new 6-partition topic; 5 s in, the broker is stopped for ``--outage`` seconds (past
the 30 s delivery timeout, so batches it had sent expire), started again, and the
producer goes on sending for 20 s; then the run waits up to ``--wait`` seconds for
every record's answer. A record is *answered* when its future is done (delivered,
or failed: an expired record is the caller's to send again). What the stall looks
like: records unanswered for good, and the producer's id left at -1.

``--rate``: instead, what the settings cost a publisher that sends as fast as it can
(``KafkaPublisher``, the simulator's: 12 jobs of 8 nodes for 120 s, 11,520 samples
to an 8-partition topic), the two settings interleaved over three rounds.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from vigil_gpu_monitor.contracts.config import KAFKA_PYTHON_PRODUCER, Config, load
from vigil_gpu_monitor.vigil.ops import localstack

AGENT_SETTINGS: dict[str, Any] = {  # producers.publisher.BufferedPublisher's defaults
    "acks": "all", "compression_type": "gzip", "linger_ms": 50, "batch_size": 256 * 1024,
    "request_timeout_ms": 10_000, "delivery_timeout_ms": 30_000, "max_block_ms": 5_000,
    "reconnect_backoff_max_ms": 2_000}


@dataclass
class Outcome:
    """What became of one variant's records."""

    sent: int
    delivered: int
    failed: int
    unanswered: int
    producer_id: int | None
    back_after: float


def _run(cfg: Config, name: str, settings: dict[str, Any], outage: float,
         wait: float) -> Outcome:
    svc = localstack.services(cfg)["kafka"]
    topic = f"outage-{name}-{int(time.time())}"
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 6, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap,
                             **{**AGENT_SETTINGS, **settings})
    futures: list[Any] = []
    stop = threading.Event()

    def send() -> None:
        i = 0
        while not stop.is_set():
            futures.append(producer.send(topic, key=str(i % 6).encode(), value=b"x" * 200))
            i += 1
            time.sleep(0.05)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    time.sleep(5)
    svc.stop()
    down = time.monotonic()
    time.sleep(outage)
    localstack.start_kafka(cfg, svc)
    back_after = time.monotonic() - down
    time.sleep(20)
    stop.set()
    sender.join()
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not all(f.is_done for f in futures):
        time.sleep(1)
    done = [f for f in futures if f.is_done]
    manager = producer._transaction_manager  # the idempotent producer's id, if any
    outcome = Outcome(len(futures), sum(f.succeeded() for f in done),
                      sum(not f.succeeded() for f in done), len(futures) - len(done),
                      manager.producer_id_and_epoch.producer_id if manager else None,
                      back_after)
    if outcome.unanswered:  # a stalled producer's close raises from its flush
        producer._sender.force_close()
    else:
        producer.close(timeout=0)
    return outcome


def _rates(cfg: Config, rounds: int = 3) -> None:
    from vigil_gpu_monitor.producers.publisher import KafkaPublisher
    from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator

    jobs = [JobSpec(f"j{i}", [f"j{i}-n{k}" for k in range(8)]) for i in range(12)]
    samples = list(Simulator(Cluster(jobs, []), 1_893_000_000.0, seed=1).samples(120))
    topic = f"outage-rate-{int(time.time())}"
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap)
    admin.create_topics([NewTopic(topic, 8, 1)])
    admin.close()
    idempotent = {"enable_idempotence": True, "max_in_flight_requests_per_connection": 5}
    print(f"| round | producer settings | samples/s ({len(samples):,} samples) | failed |")
    print("|---|---|---|---|")
    for r in range(rounds):
        for name, settings in (("Vigil's", {}), ("kafka-python defaults", idempotent)):
            publisher = KafkaPublisher(cfg.kafka_bootstrap, topic, **settings)
            t = time.perf_counter()
            for sample in samples:
                publisher.publish(sample)
            publisher.close(60)
            print(f"| {r + 1} | {name} | {len(samples) / (time.perf_counter() - t):,.0f} | "
                  f"{publisher.failed} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--outage", type=float, default=45.0,
                        help="seconds the broker is away (past the 30 s delivery timeout)")
    parser.add_argument("--wait", type=float, default=90.0,
                        help="seconds to wait for the last answers once sending stopped")
    parser.add_argument("--rate", action="store_true",
                        help="measure what the settings cost a fast publisher instead")
    args = parser.parse_args()
    cfg = load()
    if args.rate:
        _rates(cfg)
        return 0
    print("| producer settings | records sent | delivered | failed (expired) | "
          "unanswered after the wait | producer id | broker back after |")
    print("|---|---|---|---|---|---|---|")
    for name, settings in (("kafka-python defaults (idempotent)", {}),
                           ("Vigil's (KAFKA_PYTHON_PRODUCER)", KAFKA_PYTHON_PRODUCER)):
        o = _run(cfg, "vigil" if settings else "default", settings, args.outage, args.wait)
        print(f"| {name} | {o.sent:,} | {o.delivered:,} | {o.failed:,} | "
              f"**{o.unanswered:,}** | {o.producer_id} | {o.back_after:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
