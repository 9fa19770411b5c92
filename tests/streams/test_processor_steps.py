"""The worker's handling of step timings (``vigil.steps``) without Kafka: the two
topics arrive in no common order, yet the engine decides what replay of the trace
decides; offsets and checkpoints cover both topics; bad step records are dead-lettered
or dropped, counted; old checkpoints load."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.streams.fakes import FakeDelivered, FakeMessage
from tests.streams.step_trace import is_steps, keys, replayed, slow_rank_trace
from tests.streams.test_processor import _Journal
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.contracts.steps import encode_steps
from vigil_gpu_monitor.streams.align import AlignParams
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import BatchProcessor
from vigil_gpu_monitor.streams.state_codec import decode_state, encode_state

STEPS = topics.STEPS  # the default prefix is empty
SAMPLES = topics.SAMPLES
JOB = b"job-steps"


@pytest.fixture(scope="module")
def trace() -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    messages, fault = slow_rank_trace()
    return messages, replayed(messages), fault


def _delivered(messages: list[dict[str, Any]]) -> tuple[list[FakeDelivered], list[FakeDelivered]]:
    """The trace as the two topics hold it: each in its own order, its own offsets."""
    samples = [m for m in messages if not is_steps(m)]
    steps = [m for m in messages if is_steps(m)]
    return ([FakeDelivered(encode_sample(m), FakeMessage(JOB, SAMPLES, 0, i, None))  # type: ignore[arg-type]
             for i, m in enumerate(samples)],
            [FakeDelivered(encode_steps(m), FakeMessage(JOB, STEPS, 0, i, None))
             for i, m in enumerate(steps)])


def _processor(journal: _Journal, metrics: WorkerMetrics | None = None) -> BatchProcessor:
    return BatchProcessor(Config(), metrics or WorkerMetrics(), journal, journal, "test",
                          AlignParams(first_wait_seconds=3.0))


def _event_time(d: FakeDelivered) -> float:
    value = json.loads(d.value)
    if "ranks" in value:
        return max(s["end"] for r in value["ranks"] for s in r["steps"])
    return float(value["ts"])


def _uneven(samples: list[FakeDelivered], steps: list[FakeDelivered], window: float,
            ) -> list[list[FakeDelivered]]:
    """Batches as a worker catching up on a backlog may get them: a window of samples,
    then the step timings of the window before (the steps topic a window behind)."""
    t0 = _event_time(samples[0])
    batches: list[list[FakeDelivered]] = []
    k = 0
    while samples or steps:
        upto = t0 + (k + 1) * window
        now = _prefix(samples, upto)  # each topic keeps its order
        late = _prefix(steps, upto - window)
        samples, steps = samples[len(now):], steps[len(late):]
        batches += [b for b in (now, late) if b]
        k += 1
        if k > 10_000:
            raise AssertionError("no progress")
    return batches


def _prefix(messages: list[FakeDelivered], upto: float) -> list[FakeDelivered]:
    """The messages up to the first at or after ``upto``."""
    n = 0
    while n < len(messages) and _event_time(messages[n]) < upto:
        n += 1
    return messages[:n]


def _run(processor: BatchProcessor, batches: list[list[FakeDelivered]]) -> None:
    async def go() -> None:
        for batch in batches:
            await processor.handle(batch)
    asyncio.run(go())


def _found(journal: _Journal) -> list[dict[str, Any]]:
    return [d for kind, d in journal.log if kind == "detection"]


def test_step_timings_a_window_behind_the_samples_decide_what_replay_decides(trace: Any) -> None:
    messages, expected, fault = trace
    assert any(d["kind"] == "straggler" and (d["node"], d["gpu"]) == (fault.node, fault.gpu)
               and "timings" in d["evidence"]["sources"] for d in expected)
    samples, steps = _delivered(messages)
    journal, metrics = _Journal(), WorkerMetrics()
    processor = _processor(journal, metrics)
    _run(processor, _uneven(samples, steps, window=45.0))
    assert keys(_found(journal)) == keys(expected)
    assert metrics.late_steps._value.get() == 0
    assert metrics.step_batches._value.get() == len(steps)
    aligner = processor.aligners["job-steps"]
    assert aligner.held == 0 and not aligner.forced  # every wait ended by the other topic


def test_without_the_aligner_the_lagging_timings_would_be_late(trace: Any) -> None:
    """The same batches folded in arrival order lose timings: what the aligner is for."""
    from vigil_gpu_monitor.contracts.steps import decode_steps
    from vigil_gpu_monitor.detectors.engine import ReplayRunner

    messages, expected, _ = trace
    samples, steps = _delivered(messages)
    runner = ReplayRunner(Config().detect)
    for batch in _uneven(samples, steps, window=45.0):
        for d in batch:
            if d.message.topic == STEPS:
                runner.feed_steps(decode_steps(d.value))
            else:
                runner.feed(json.loads(d.value))
    assert runner.engines["job-steps"].late > 0


def test_a_crash_re_reads_both_topics_from_the_commit_and_decides_what_replay_decides(
        trace: Any) -> None:
    messages, expected, _ = trace
    samples, steps = _delivered(messages)
    batches = _uneven(samples, steps, window=30.0)
    journal = _Journal()
    first = _processor(journal)
    done = 0
    for k, batch in enumerate(batches):
        _run(first, [batch])
        done = k
        if k >= len(batches) // 2 and first.commit_floor((STEPS, 0)) is not None \
                and first.commit_floor((SAMPLES, 0)) is not None:
            break  # the crash comes while messages of both topics are in no checkpoint
    floors = {t: first.commit_floor((t, 0)) for t in (SAMPLES, STEPS)}
    state = decode_state(journal.store[JOB])
    assert state is not None and state["step_offsets"]["0"] >= 1 and state["align"]["timed"]
    assert all(f is not None for f in floors.values())
    # a new processor on the same store gets both topics again from their commits
    second = _processor(journal)
    again = [d for b in batches[:done + 1] for d in b
             if d.message.offset >= floors[d.message.topic]]  # type: ignore[operator]
    rest = batches[done + 1:]
    _run(second, [again[i:i + 100] for i in range(0, len(again), 100)] + rest)
    assert keys(_found(journal)) == keys(expected)


def test_bad_step_batches_are_dead_lettered_and_bad_records_dropped_counted(trace: Any) -> None:
    messages, _, _ = trace
    _, steps = _delivered(messages[:200])
    good = json.loads(steps[3].value)
    bad_record = dict(good, ranks=[dict(good["ranks"][0], steps=[
        *good["ranks"][0]["steps"], {"step": 1, "end": 5.0, "wall": -1.0}])] + good["ranks"][1:])
    poison = [b'{"schema": "vigil.step/1", "job": ',
              json.dumps(dict(good, node="Not A Host!")).encode(),
              json.dumps({**good, "extra": 1}).encode()]
    batch = [*steps[:3],
             *[FakeDelivered(v, FakeMessage(JOB, STEPS, 0, 1000 + i, None))
               for i, v in enumerate(poison)],
             FakeDelivered(json.dumps(bad_record).encode(), FakeMessage(JOB, STEPS, 0, 1003, None))]
    journal, metrics = _Journal(), WorkerMetrics()
    processor = _processor(journal, metrics)
    _run(processor, [batch])
    letters = [json.loads(v) for kind, v in journal.log if kind == "deadletter"]
    assert [(r["reason"], r["source"]["offset"]) for r in letters] == [
        ("invalid_json", 1000), ("bad_name", 1001), ("unknown_field", 1002)]
    assert processor.deadletters == 3 and metrics.step_batches._value.get() == 4
    assert metrics.step_batches_refused.labels("bad_name")._value.get() == 1
    assert metrics.step_records_dropped.labels("out_of_range")._value.get() == 1


def test_a_samples_only_checkpoint_is_unchanged_and_one_without_step_offsets_loads() -> None:
    from tests.streams.test_processor import _batches

    journal = _Journal()
    processor = BatchProcessor(Config(), WorkerMetrics(), journal, journal, "test")
    for batch in _batches():
        _run(processor, [batch])
    processor.checkpoint(processor.live["proc-job"])
    state = decode_state(journal.store[b"proc-job"])
    assert state is not None and "step_offsets" not in state and "align" not in state
    # a checkpoint an older worker wrote (no step offsets) restores as before
    old = _Journal()
    old.store[b"proc-job"] = encode_state(state)
    successor = BatchProcessor(Config(), WorkerMetrics(), old, old, "test",
                               AlignParams(first_wait_seconds=3.0))
    successor.engine_for("proc-job")
    assert successor.folded["proc-job"] == {(False, 0): state["source_offsets"]["0"]}
    assert successor.aligners["proc-job"].timed is False  # known samples-only: no wait


def test_timings_alone_are_folded_once_no_counters_come() -> None:
    messages, _ = slow_rank_trace()
    _, steps = _delivered(messages)
    journal = _Journal()
    processor = _processor(journal)
    _run(processor, [steps[:400]])
    assert processor.aligners["job-steps"].held == 400  # waiting for counters
    assert processor.commit_floor((STEPS, 0)) == 0  # and not committed
    folded = asyncio.run(processor.release_waiting(now=10**9))
    assert folded == 400 and processor.aligners["job-steps"].held == 0
    assert processor.live["job-steps"].next_bin is not None


def test_with_identity_on_a_step_batch_must_carry_its_nodes_proof(trace: Any) -> None:
    from vigil_gpu_monitor.contracts.config import IdentityConfig, Secret
    from vigil_gpu_monitor.contracts.identity import Signer, node_key

    master = bytes(range(32))
    cfg = Config(identity=IdentityConfig(verify=True, master_keys=Secret(f"k1={master.hex()}")))
    messages, _, _ = trace
    _, steps = _delivered(messages[:100])
    own, forged, unsigned = steps[0], steps[1], steps[2]
    node = json.loads(own.value)["node"]
    own.message.headers = Signer("k1", node_key(master, node)).headers(own.value)  # type: ignore[attr-defined]
    other = "somewhere-else" if json.loads(forged.value)["node"] != "somewhere-else" else "x"
    forged.message.headers = Signer("k1", node_key(master, other)).headers(forged.value)  # type: ignore[attr-defined]
    unsigned.message.headers = []  # type: ignore[attr-defined]
    journal, metrics = _Journal(), WorkerMetrics()
    processor = BatchProcessor(cfg, metrics, journal, journal, "test")
    _run(processor, [[own, forged, unsigned]])
    letters = [json.loads(v)["reason"] for kind, v in journal.log if kind == "deadletter"]
    assert letters == ["bad_signature", "unsigned"]
    assert metrics.step_batches._value.get() == 1
