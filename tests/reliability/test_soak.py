"""Long runs for `make soak` (not part of `make test`): a channel hard-down for ten
minutes, and sustained load at twice the benchmarked worker throughput for ten
minutes. ``SOAK_SECONDS`` (default 600) and ``SOAK_RATE`` (node-samples/s, default
10200 = 2 × the ~5,100/s one worker sustains on 8-node jobs, bench/RESULTS.md) scale
them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer

from tests.alerting.http_recorder import Recorder
from tests.alerting.test_delivery import det
from tests.integration.kafka_helpers import start_worker
from tests.integration.ports import free_port
from tests.integration.scrape import metric
from vigil_gpu_monitor.alerting.service import Alerter, build_channels
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config, load
from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator
from vigil_gpu_monitor.vigil.ops.kafka_admin import delete_topics_starting, ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.soak]
SOAK = float(os.environ.get("SOAK_SECONDS", "600"))
RATE = float(os.environ.get("SOAK_RATE", "10200"))
START = 1_900_000_000.0


def test_channel_hard_down_for_ten_minutes(isolated_env: dict[str, str]) -> None:
    dead_port = free_port()  # nothing listens here until the channel "comes back"
    with Recorder() as slack:
        cfg = load(env=dict(isolated_env, VIGIL_ALERTER_SLACK_WEBHOOK=slack.url,
                            VIGIL_ALERTER_SLACK_RATE_PER_SECOND="20",
                            VIGIL_ALERTER_PAGE_AFTER_SECONDS="0",
                            VIGIL_ALERTER_WEBHOOK_URL=f"http://127.0.0.1:{dead_port}/hook",
                            VIGIL_ALERTER_WEBHOOK_SECRET="k"))
        ensure_topics(cfg)
        consumer = KafkaConsumer(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                                 bootstrap_servers=cfg.kafka_bootstrap,
                                 group_id=cfg.alerter.group_id, enable_auto_commit=False,
                                 auto_offset_reset="earliest")
        state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
        alerter = Alerter(cfg, consumer, state, build_channels(cfg))
        loop = threading.Thread(target=alerter.run, daemon=True)
        loop.start()
        producer = KafkaProducer(bootstrap_servers=cfg.kafka_bootstrap, acks="all")
        sent: dict[str, float] = {}  # incident → when published (monotonic)
        back: Recorder | None = None
        try:
            t0 = time.monotonic()
            i = 0
            while time.monotonic() - t0 < SOAK + 60:
                if back is None and time.monotonic() - t0 >= SOAK:
                    back = Recorder(port=dead_port).__enter__()  # the channel returns
                now = time.time()
                d = dict(det(ident=f"soak-{i}", job=f"job-{i % 7}"), started_at=now - 30,
                         detected_at=now, node=f"n{i}")  # distinct conditions: no flapping
                producer.send(topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
                              key=d["job"].encode(), value=encode_detection(d))
                sent[d["id"]] = time.monotonic()
                i += 1
                time.sleep(5)
            producer.flush()
            assert loop.is_alive(), "the alerter loop died"
            slack.wait_for(len(sent), timeout=60)
            deadline = time.monotonic() + 600  # queued webhook messages go out at 1/s
            while time.monotonic() < deadline and any(w.pending() for w in
                                                      alerter.workers.values()):
                time.sleep(1)
            while time.monotonic() < deadline and len(_finals(state, "webhook")) < len(sent):
                time.sleep(1)  # the message in flight gets its outcome
        finally:
            alerter.stop()
            loop.join(30)
            alerter.close()
            consumer.close()
            producer.close()
            if back is not None:
                back.__exit__()
    # The rest of the pipeline was unaffected: every incident reached Slack, promptly.
    told = {re.search(r"incident `([^`]+)`", r.json()["text"]).group(1): r.at  # type: ignore[union-attr]
            for r in slack.requests}
    assert set(told) == set(sent), sorted(set(sent) - set(told))[:5]
    slow = {i: told[i] - sent[i] for i in sent if told[i] - sent[i] > 10}
    assert not slow, f"Slack waited on the dead channel: {list(slow.items())[:5]}"
    # The dead channel: each incident retried, then dead-lettered while it was down
    # (or queued and delivered once it came back); none is left without an outcome.
    final = _finals(state, "webhook")
    assert set(final) == set(sent), sorted(set(sent) - set(final))[:5]
    dead = [e for e in final.values() if e["result"] == "dead_letter"]
    assert dead and all(int(e["attempts"]) >= 2 for e in dead), dead[:3]
    undelivered = {json.loads(f[b"detection"])["id"] for _, f in state.r.xrange(
        f"{state.prefix}:undelivered")}
    assert {e["incident"] for e in dead} <= undelivered
    after = [i for i, at in sent.items() if at - min(sent.values()) > SOAK + 5]
    assert after and all(final[i]["result"] == "delivered" for i in after)
    assert back is not None and {r.json()["id"] for r in back.requests} >= set(after)
    assert len(state.open_incidents()) == len(sent)
    worst = max(told[i] - sent[i] for i in sent)
    print(f"channel down {SOAK:.0f}s: {len(sent)} incidents; Slack told of all, slowest "
          f"{worst:.1f}s after publishing; webhook: {len(dead)} dead-lettered (attempts "
          f"{min(int(e['attempts']) for e in dead)}-{max(int(e['attempts']) for e in dead)}), "
          f"{len(final) - len(dead)} delivered after it came back")


def _finals(state: LiveState, channel: str) -> dict[str, dict[str, str]]:
    """Incident → its final delivery outcome (delivered or dead_letter) on a channel."""
    log = state.deliveries(count=100_000)
    return {e["incident"]: e for e in reversed(log)  # newest entry per incident wins
            if e["channel"] == channel and e["result"] != "retry"}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _offer(bootstrap: str, topic: str, base: list[tuple[bytes, bytes, float, bytes]],
                 loop_seconds: float, seconds: float, rate: float,
                 probe: Any) -> tuple[int, float]:
    """Publish ``base`` again and again (each pass later in event time) at ``rate``
    messages/s for ``seconds``; aiokafka's C record batches keep the generator cheap
    enough to leave the worker its core. Returns (messages, offered rate)."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.partitioner import DefaultPartitioner

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, linger_ms=20,
                                max_batch_size=512 * 1024)
    await producer.start()
    try:
        parts = sorted(await producer.partitions_for(topic))
        partitioner = DefaultPartitioner()
        where = {key: partitioner(key, parts, parts) for key, _, _, _ in base}
        published, t0, shift = 0, time.monotonic(), 0.0
        batches: dict[int, Any] = {}
        while time.monotonic() - t0 < seconds:
            for key, head, ts, tail in base:
                part = where[key]
                batch = batches.get(part) or batches.setdefault(part, producer.create_batch())
                if batch.append(key=key, value=head + b"%.3f" % (ts + shift) + tail,
                                timestamp=None) is None:
                    await producer.send_batch(batch, topic, partition=part)
                    batches[part] = batch = producer.create_batch()
                    batch.append(key=key, value=head + b"%.3f" % (ts + shift) + tail,
                                 timestamp=None)
                published += 1
                if published % 2000 == 0:
                    for p, full in batches.items():
                        await producer.send_batch(full, topic, partition=p)
                    batches.clear()
                    ahead = published / rate - (time.monotonic() - t0)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                    if published % 20_000 == 0:
                        probe(time.monotonic() - t0)
                    if time.monotonic() - t0 >= seconds:
                        break
            shift += loop_seconds
        offered = published / (time.monotonic() - t0)
        for p, full in batches.items():
            await producer.send_batch(full, topic, partition=p)
        await producer.flush()
        return published, offered
    finally:
        await producer.stop()


def test_twice_the_worker_throughput_for_ten_minutes(isolated_env: dict[str, str],
                                                     isolated_cfg: Config,
                                                     tmp_path: Path) -> None:
    port = free_port()
    env = dict(isolated_env, VIGIL_WORKER_WEB_PORT=str(port))
    ensure_topics(isolated_cfg)
    jobs = [JobSpec(f"load-{j:03d}", [f"l{j:03d}-{i}" for i in range(8)]) for j in range(100)]
    loop_seconds = 60.0
    base = []
    for sample in Simulator(Cluster(jobs, []), START, seed=2).samples(loop_seconds):
        raw = encode_sample(sample)
        head, rest = raw.split(b'"ts":', 1)
        number, tail = rest.split(b",", 1)
        base.append((sample["job"].encode(), head + b'"ts":', float(number), b"," + tail))
    name = topics.topic(topics.SAMPLES, isolated_cfg.kafka.topic_prefix)
    worker = start_worker(env, str(tmp_path / "worker.log"))
    rss: list[tuple[float, float]] = []
    lag: list[tuple[float, float]] = []

    def probe(at: float) -> None:
        rss.append((at, _rss_mb(worker.pid)))
        lag.append((at, metric(port, "vigil_worker_lag_messages")))

    try:
        time.sleep(10)
        t0 = time.monotonic()
        published, offered = asyncio.run(_offer(isolated_cfg.kafka_bootstrap, name, base,
                                                loop_seconds, SOAK, RATE, probe))
        # The load drops to nothing: the backlog must drain.
        deadline = time.monotonic() + 4 * SOAK
        while time.monotonic() < deadline:
            assert worker.poll() is None, "the worker crashed under load"
            done = metric(port, "vigil_worker_samples")
            rss.append((time.monotonic() - t0, _rss_mb(worker.pid)))
            if done >= published:
                break
            time.sleep(10)
        drained_after = time.monotonic() - t0 - SOAK
        done = metric(port, "vigil_worker_samples")
        errors = metric(port, "vigil_worker_batch_errors")
        dead = metric(port, "vigil_worker_deadletters")
        # one worker, no rebalance: the offset guard must find nothing to repair, even
        # with the fetch position far ahead of processing the whole time
        offset_events = metric(port, "vigil_worker_offset_events")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        # ~31 GB at the defaults: a second run against the same broker filled the
        # build machine's disk before the run cleaned up after itself
        delete_topics_starting(isolated_cfg, (isolated_cfg.kafka.topic_prefix,
                                              f"{isolated_cfg.worker.app_id}-"))
    peak = max(r for _, r in rss)
    # Faust's stalled-stream check: a partition with a backlog that no batch has taken
    # from for ``stream_processing_timeout`` (its log: "Stream has not started
    # processing", "Stream stopped processing, or is slow")
    log_text = (tmp_path / "worker.log").read_text(errors="replace")
    stalled = sum(log_text.count(m) for m in ("has not started processing",
                                              "Stream stopped processing"))
    report = (f"offered {offered:,.0f}/s for {SOAK:.0f}s ({published:,} samples); processed "
              f"{done:,.0f}; drained {drained_after:.0f}s after the load stopped; worker RSS "
              f"peak {peak:.0f} MB; max lag {max((v for _, v in lag), default=0):,.0f}; "
              f"offset guard events {offset_events:.0f}; stalled-stream errors {stalled}")
    print(report)
    (tmp_path / "soak.txt").write_text(report)
    assert done == published and errors == 0 and dead == 0, report
    assert offset_events == 0, report
    assert stalled == 0, report  # every partition's backlog was being worked on
    assert offered >= 0.8 * RATE, report  # the load really was twice the worker's rate
    assert peak < 2048, report  # bounded: the backlog waits in Kafka, not in the worker
    late_rss = [r for t, r in rss if t > SOAK / 2]
    early_rss = [r for t, r in rss if SOAK / 4 < t <= SOAK / 2]
    assert early_rss and max(late_rss) < max(early_rss) + 256, report  # no steady growth
