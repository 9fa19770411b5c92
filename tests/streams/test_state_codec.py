"""Checkpoints: what is stored comes back exactly, and checkpoints of the previous
codec (zlib) are still read after an upgrade."""

from __future__ import annotations

import math
import zlib

import orjson

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.detectors.engine import JobEngine
from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator
from vigil_gpu_monitor.streams.state_codec import decode_state, encode_state

START = 1_897_000_000.0


def _engine_state() -> dict[str, object]:
    engine = JobEngine("codec", DetectConfig())
    for sample in Simulator(Cluster([JobSpec("codec", ["a", "b", "c", "d"])], []), START,
                            seed=2).samples(80):
        engine.ingest(sample)
        engine.advance()
    return engine.to_state()


def test_a_checkpoint_comes_back_exactly_and_smaller() -> None:
    state = orjson.loads(orjson.dumps(_engine_state()))  # as JSON gives it back
    blob = encode_state(state)
    assert decode_state(blob) == state
    assert len(blob) < len(orjson.dumps(state)) / 2


def test_a_zlib_checkpoint_of_the_previous_version_is_still_read() -> None:
    state = {"window": {"open": {}}, "max_ts": START, "score": [1.5, None, math.pi]}
    assert decode_state(zlib.compress(orjson.dumps(state), 1)) == state
    assert decode_state(None) is None and decode_state(b"") is None
