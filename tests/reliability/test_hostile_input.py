"""Hostile input: every message is either a valid sample or a ContractError with a
reason — never another exception, never unbounded memory — and through the real
worker every bad one is dead-lettered while the good ones are still detected."""

from __future__ import annotations

import base64
import json
import random
import signal
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.kafka_helpers import log_excerpt, publish, read_topic, start_worker
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import MAX_MESSAGE_BYTES, DroppedReading, encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.streams.decode import decode_sample_fast

START = 1_870_000_000.0


def _sample(**override: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"schema": "vigil.sample/1", "ts": START, "job": "j", "node": "n",
                            "gpus": {"0": {"sm_active": 0.5, "ecc_sbe": 3}}, "host": {},
                            "nics": {}}
    base.update(override)
    return base


def _dump(obj: Any) -> bytes:
    return json.dumps(obj).encode()


# reason the decoder must give → hostile bytes
HOSTILE: dict[str, list[bytes]] = {
    "invalid_json": [b'{"schema": "vigil.sample/1", "ts": ', b"\xff\xfe\x00garbage", b"",
                     b"[" * 200_000 + b"]" * 200_000],  # deep nesting
    "too_large": [b'{"pad": "' + b"x" * (10 << 20) + b'"}'],  # 10 MB
    "non_finite": [b'{"schema":"vigil.sample/1","ts":Infinity,"job":"j","node":"n",'
                   b'"gpus":{},"host":{},"nics":{}}',
                   b'{"schema":"vigil.sample/1","ts":NaN,"job":"j","node":"n",'
                   b'"gpus":{},"host":{},"nics":{}}'],
    "out_of_range": [_dump(_sample(ts=-1.0))],
    "wrong_type": [_dump(_sample(job=7)), _dump([1, 2, 3]), b"null"],
    "unknown_metric": [_dump(_sample(gpus={"0": {"process_name": 1.0}}))],
    "unknown_field": [_dump(_sample(cmdline="python train.py --secret"))],
    "bad_value": [_dump(_sample(gpus={"٣": {"sm_active": 0.1}}))],
    # names are names (issue #49): one RFC 1123 host name, a job id of a stated set
    "bad_name": [_dump(_sample(node="")), _dump(_sample(node="gpu-[01-04]")),
                 _dump(_sample(node="ALL")), _dump(_sample(node="../x")),
                 _dump(_sample(node="узел-01")), _dump(_sample(job="a b"))],
}


# one bad reading in an otherwise good sample: that reading is dropped (with this
# reason), the sample kept (DESIGN principle 14), never dead-lettered
ONE_BAD_READING: dict[str, list[bytes]] = {
    "non_finite": [b'{"schema":"vigil.sample/1","ts":1,"job":"j","node":"n",'
                   b'"gpus":{"0":{"power":NaN,"ecc_sbe":3}},"host":{},"nics":{}}',
                   b'{"schema":"vigil.sample/1","ts":1,"job":"j","node":"n",'
                   b'"gpus":{"0":{"power":1e999,"ecc_sbe":3}},"host":{},"nics":{}}'],
    "out_of_range": [_dump(_sample(gpus={"0": {"ecc_sbe": -5, "power": 3}})),
                     _dump(_sample(gpus={"0": {"power": 10 ** 400, "ecc_sbe": 3}})),
                     _dump(_sample(gpus={"0": {"power": 140737488355328.0, "ecc_sbe": 3}}))],
    "wrong_type": [_dump(_sample(gpus={"0": {"sm_active": "0.5", "ecc_sbe": 3}})),
                   _dump(_sample(gpus={"0": {"sm_active": True, "ecc_sbe": 3}}))],
}


@pytest.mark.parametrize("reason,raw", [(r, x) for r, xs in ONE_BAD_READING.items() for x in xs],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_one_bad_reading_costs_that_reading_not_the_sample(reason: str, raw: bytes) -> None:
    dropped: list[DroppedReading] = []
    sample = decode_sample_fast(raw, dropped)
    assert [d.reason for d in dropped] == [reason]
    assert dropped[0].metric not in sample["gpus"]["0"] and len(sample["gpus"]["0"]) == 1


@pytest.mark.parametrize("reason,raw", [(r, x) for r, xs in HOSTILE.items() for x in xs],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_each_hostile_message_is_refused_with_its_reason(reason: str, raw: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ContractError) as err:
            decode_sample_fast(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert err.value.reason == reason
    # Memory stays bounded: an oversize message is refused before it is parsed.
    assert peak < 4 * min(len(raw), MAX_MESSAGE_BYTES) + (8 << 20), peak


def test_unicode_names_are_refused_and_ascii_ones_kept() -> None:
    """Node names reach scontrol and the Kubernetes API: ASCII host names only
    (docs/contract.md, "Identifiers"; Kubernetes job ids are namespace/name)."""
    with pytest.raises(ContractError) as err:
        encode_sample(_sample(job="训练-ジョブ-🚀", node="узел-01"))  # type: ignore[arg-type]
    assert err.value.reason == "bad_name"
    sample = _sample(job="team-a/train-70b", node="gpu-01.rack-3")
    assert decode_sample_fast(encode_sample(sample))["job"] == "team-a/train-70b"  # type: ignore[arg-type]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children,
                                                                      max_size=4),
    max_leaves=20)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.binary(max_size=400),
    _json.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["schema", "ts", "job", "node", "gpus", "host", "nics",
                                     "meta"]), _json).map(
        lambda d: json.dumps({"schema": "vigil.sample/1", **d}).encode())))
def test_fuzzed_bytes_give_a_sample_or_a_contract_error(raw: bytes) -> None:
    try:
        sample = decode_sample_fast(raw)
    except ContractError as exc:
        assert exc.reason and isinstance(exc.detail, str)
    else:
        assert sample["schema"] == "vigil.sample/1"


@pytest.mark.integration
def test_worker_dead_letters_hostile_input_and_still_detects(
        isolated_env: dict[str, str], isolated_cfg: Config, tmp_path: Path) -> None:
    # Kafka's default 1 MB limit stops the 10 MB message at the producer; the worker's
    # own 512 KiB limit is exercised with a 900 KB message the broker accepts.
    sendable = {r: [x for x in xs if len(x) < 1_000_000] for r, xs in HOSTILE.items()}
    sendable["too_large"] = [b'{"pad": "' + b"y" * 900_000 + b'"}']
    rng = random.Random(7)  # and random bytes, which can never be a sample
    sendable["invalid_json"] += [b"\x00" + rng.randbytes(rng.randint(0, 2000))
                                 for _ in range(30)]
    hostile = [x for xs in sendable.values() for x in xs]
    survivors = [x for xs in ONE_BAD_READING.values() for x in xs]  # kept, not dead
    job = JobSpec("job-hostile", [f"hn-{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("slow_gpu", job.name, job.nodes[2], "1", START + 40)])
    good = list(Simulator(cluster, START, seed=3).samples(130))
    third = len(good) // 3
    publish(isolated_cfg, good[:third], raw=hostile + survivors)
    publish(isolated_cfg, good[third:], raw=hostile + survivors)
    worker = start_worker(isolated_env, str(tmp_path / "worker.log"))
    try:
        dead = read_topic(isolated_cfg, topics.DEADLETTER, lambda v: len(v) >= 2 * len(hostile),
                          120, worker)
        dets = read_topic(isolated_cfg, topics.DETECTIONS, lambda v: len(v) >= 1, 90, worker)
        assert worker.poll() is None, "the worker died on hostile input"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    records = [json.loads(v) for v in dead]
    want = Counter({r: 2 * len(xs) for r, xs in sendable.items() if xs})
    assert Counter(r["reason"] for r in records) == want, (
        log_excerpt(tmp_path / "worker.log"))
    big = [r for r in records if r["reason"] == "too_large"]
    assert all(r["original_bytes"] == len(sendable["too_large"][0]) for r in big)
    assert {base64.b64decode(r["original_b64"]) for r in records} == set(hostile)
    firing = [json.loads(v) for v in dets]
    assert [(d["job"], d["node"], d["gpu"]) for d in firing if d["state"] == "firing"] == [
        (job.name, job.nodes[2], "1")]
