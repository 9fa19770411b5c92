"""The live worker reads step timings (``vigil.steps``) beside the samples (issue
#47): on a trace of a job with a 10 % slow rank, its detections are exactly `vigil
replay`'s on the same trace (the straggler found from counters and timings, at its
GPU), a malformed step batch is dead-lettered with its reason, and its metrics
count the step batches consumed and refused."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.kafka_helpers import (
    VIGIL,
    log_excerpt,
    publish_trace,
    read_topic,
    start_worker,
)
from tests.integration.ports import free_port
from tests.integration.scrape import metric
from tests.streams.step_trace import is_steps, keys, slow_rank_trace
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.steps import encode_steps

pytestmark = pytest.mark.integration
BROKEN = b'{"schema": "vigil.step/1", "job": "job-steps", "ranks": ['


def test_the_worker_decides_on_timings_what_replay_decides(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    messages, fault = slow_rank_trace()
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"".join((encode_steps(m) if is_steps(m) else encode_sample(m)) + b"\n"
                               for m in messages))  # type: ignore[arg-type]
    out = tmp_path / "replay.jsonl"
    subprocess.run([*VIGIL, "replay", str(trace), "--out", str(out)], env=isolated_env,
                   check=True, timeout=120)
    replayed = [decode_detection(line) for line in out.read_bytes().splitlines()]
    expected = keys(replayed)  # type: ignore[arg-type]
    assert [(d["kind"], d["node"], d["gpu"]) for d in replayed if d["state"] == "firing"] == [
        ("straggler", fault.node, fault.gpu)]
    assert "timings" in replayed[0]["evidence"]["sources"]

    publish_trace(isolated_cfg, messages, raw_steps=[BROKEN])
    port = free_port()
    env = dict(isolated_env, VIGIL_WORKER_WEB_PORT=str(port))
    log = tmp_path / "worker.log"
    worker = start_worker(env, str(log))
    batches = sum(map(is_steps, messages))
    try:
        values = read_topic(isolated_cfg, topics.DETECTIONS,
                            lambda v: keys([decode_detection(x) for x in v]) >= expected,  # type: ignore[misc]
                            180, worker)
        dead = read_topic(isolated_cfg, topics.DEADLETTER, lambda v: len(v) >= 1, 60, worker)
        deadline = time.monotonic() + 60
        while metric(port, "vigil_worker_step_batches_total") < batches \
                and time.monotonic() < deadline:
            time.sleep(1)
        consumed = metric(port, "vigil_worker_step_batches_total")
        refused = metric(port, "vigil_worker_step_batches_refused_total", reason="invalid_json")
        late = metric(port, "vigil_worker_late_steps_total")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    published = keys([decode_detection(v) for v in values])  # type: ignore[misc]
    tail = log_excerpt(log)
    assert published == expected, f"{published ^ expected}\n{tail}"
    [letter] = [json.loads(v) for v in dead]
    assert letter["reason"] == "invalid_json"
    assert letter["source"]["topic"].endswith("vigil.steps")
    assert (consumed, refused, late) == (batches, 1, 0), tail


def test_a_steps_topic_not_co_partitioned_with_the_samples_is_refused(
        isolated_cfg: Config) -> None:
    """A steps topic made elsewhere (a broker's auto-creation) with another partition
    count would send a job's timings to another worker than its samples."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from vigil_gpu_monitor.contracts.errors import ConfigError
    from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics

    name = topics.topic(topics.STEPS, isolated_cfg.kafka.topic_prefix)
    admin = KafkaAdminClient(bootstrap_servers=isolated_cfg.kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(name, 3, 1)])
    finally:
        admin.close()
    with pytest.raises(ConfigError, match=f"{name} has 3 partitions"):
        ensure_topics(isolated_cfg)
