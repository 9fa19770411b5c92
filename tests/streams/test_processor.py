"""The worker's batch and revoke handling without Kafka: the order send → checkpoint
→ commit, dead letters with their reason, recovery from a checkpoint, status."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.streams.fakes import DictTable, FakeDelivered, FakeMessage
from vigil_gpu_monitor.contracts.codec import decode_detection, encode_sample
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import BatchProcessor
from vigil_gpu_monitor.streams.state_codec import decode_state

START = 1_898_000_000.0


class _Journal(DictTable):
    """The checkpoint store and the outlets in one, writing every effect to ``log``."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, Any]] = []

    def _written(self, key: bytes) -> None:
        self.log.append(("checkpoint", key.decode()))

    async def detection(self, key: bytes, value: bytes, headers: dict[str, bytes]) -> None:
        self.log.append(("detection", decode_detection(value)))

    async def deadletter(self, key: bytes | None, value: bytes) -> None:
        self.log.append(("deadletter", value))


def _batches(size: int = 200) -> list[list[FakeDelivered]]:
    job = JobSpec("proc-job", [f"p{i}" for i in range(4)])
    cluster = Cluster([job], [Fault("slow_gpu", job.name, "p1", "2", START + 40)])
    delivered = [FakeDelivered(encode_sample(s), FakeMessage(b"proc-job", "samples", 0, i,
                                                       START + i / 4))
                 for i, s in enumerate(Simulator(cluster, START, seed=3).samples(150))]
    return [delivered[i:i + size] for i in range(0, len(delivered), size)]


def _processor(journal: _Journal) -> BatchProcessor:
    return BatchProcessor(Config(), WorkerMetrics(), journal, journal, "test-worker")


def test_detections_are_sent_before_their_engine_is_checkpointed() -> None:
    journal = _Journal()
    processor = _processor(journal)
    sent_in: list[list[str]] = []
    for batch in _batches():
        journal.log.clear()
        asyncio.run(processor.handle(batch))
        sent_in.append([kind for kind, _ in journal.log])
    with_detections = [kinds for kinds in sent_in if "detection" in kinds]
    assert with_detections, "the slow GPU was not detected"
    for kinds in with_detections:  # every send of the batch, then its checkpoint
        assert kinds[-1] == "checkpoint" and "checkpoint" not in kinds[:-1], kinds


def test_revocation_checkpoints_then_flushes_then_commits() -> None:
    journal = _Journal()
    processor = _processor(journal)
    asyncio.run(processor.handle(_batches()[0]))
    journal.log.clear()

    async def flush() -> None:
        journal.log.append(("flush", None))

    async def commit() -> None:
        journal.log.append(("commit", None))

    asyncio.run(processor.on_revoked(flush, commit))
    assert [kind for kind, _ in journal.log] == ["checkpoint", "flush", "commit"]
    assert processor.live == {}


def test_a_new_owner_resumes_from_the_checkpoint() -> None:
    journal = _Journal()
    first, rest = _batches()[0], _batches()[1:]
    processor = _processor(journal)
    asyncio.run(processor.handle(first))
    asyncio.run(processor.on_revoked(_noop, _noop))
    successor = _processor(journal)  # same checkpoint store, fresh process
    engine = successor.engine_for("proc-job")
    assert engine.next_bin == processor_next_bin(journal)
    for batch in rest:
        asyncio.run(successor.handle(batch))
    assert any(k == "detection" and d["node"] == "p1" for k, d in journal.log)


def test_a_bad_message_is_dead_lettered_with_its_reason_and_its_neighbours_kept() -> None:
    journal = _Journal()
    processor = _processor(journal)
    batch = _batches(20)[0]
    batch.insert(5, FakeDelivered(b'{"schema": "vigil.sample/1", "ts": "soon"}',
                               FakeMessage(b"proc-job", "samples", 0, 999, None)))
    asyncio.run(processor.handle(batch))
    [(kind, value)] = [entry for entry in journal.log if entry[0] == "deadletter"]
    record = json.loads(value)
    assert record["source"]["offset"] == 999 and record["reason"] == "missing_field"
    assert processor.samples == 20 and processor.deadletters == 1


def test_status_messages_carry_heat_once_and_a_heartbeat_always() -> None:
    journal = _Journal()
    processor = _processor(journal)
    for batch in _batches()[:2]:
        asyncio.run(processor.handle(batch))
    first = processor.status_messages(START + 100, {"0": 3})
    assert [m["kind"] for m in first] == ["job", "worker"]
    assert first[1]["lag"] == {"0": 3} and first[1]["samples"] == processor.samples
    assert len(first[0]["heat"]) == 4 * 8  # every GPU of the job
    assert [m["kind"] for m in processor.status_messages(START + 105, {})] == ["worker"]


async def _noop() -> None:
    return None


def processor_next_bin(journal: _Journal) -> int | None:
    state = decode_state(journal.store[b"proc-job"])
    assert state is not None
    return state["next_bin"]


def test_commits_stop_at_the_first_sample_a_checkpoint_lacks_and_a_restart_skips_the_rest(
        ) -> None:
    """Crash equals replay: the commit never passes a sample some job's checkpoint
    lacks, and a restarted processor given those samples again folds in only what
    its checkpoints lack, so it decides what one uninterrupted run decides."""
    batches = _batches(size=37)
    whole = _Journal()
    straight = _processor(whole)
    for batch in batches:
        asyncio.run(straight.handle(batch))
    expected = [d for kind, d in whole.log if kind == "detection"]

    journal = _Journal()
    first = _processor(journal)
    done = 0
    for k, batch in enumerate(batches):
        asyncio.run(first.handle(batch))
        done += len(batch)
        if k >= len(batches) // 2 and first.commit_floor(("samples", 0)) is not None:
            break  # the crash comes while some samples are in no checkpoint
    floor = first.commit_floor(("samples", 0))
    saved = decode_state(journal.store[b"proc-job"])["source_offsets"]["0"]
    assert floor is not None and floor == saved  # what the checkpoint lacks starts there
    assert floor < done < len(batches) * 37
    before = [d for kind, d in journal.log if kind == "detection"]
    # a crash: a new processor on the same store gets everything from the commit on
    second = _processor(journal)
    redelivered = [d for b in batches for d in b if d.message.offset >= floor]
    for i in range(0, len(redelivered), 50):
        asyncio.run(second.handle(redelivered[i:i + 50]))
    after = [d for kind, d in journal.log if kind == "detection"][len(before):]
    seen = {(d["id"], d["state"], d["detected_at"]) for d in before + after}
    assert seen == {(d["id"], d["state"], d["detected_at"]) for d in expected}


def test_a_job_that_stops_sending_is_checkpointed_so_the_commit_can_catch_up() -> None:
    journal = _Journal()
    processor = _processor(journal)
    for batch in _batches(size=37):
        asyncio.run(processor.handle(batch))
        if processor.commit_floor(("samples", 0)) is not None:
            break
    assert processor.commit_floor(("samples", 0)) is not None  # samples in no checkpoint yet
    ended = processor.last_batch["proc-job"]
    assert processor.checkpoint_quiet(2.0, now=ended + 1.0) == 0  # not quiet long enough
    assert processor.checkpoint_quiet(2.0, now=ended + 2.5) == 1
    assert processor.commit_floor(("samples", 0)) is None
    saved = decode_state(journal.store[b"proc-job"])["source_offsets"]["0"]
    assert saved == batch[-1].message.offset + 1


def test_a_job_idle_long_enough_is_dropped_and_comes_back_from_its_checkpoint() -> None:
    """A worker that watches jobs come and go must not keep every ended job's engine:
    one with no batch for the idle time is checkpointed and dropped, with all the
    worker keeps of it. If the job sends again it comes back from that checkpoint,
    and its detections are the ones a worker that kept it live sends."""
    batches = _batches(size=37)
    kept = _Journal()
    live = _processor(kept)
    for batch in batches:
        asyncio.run(live.handle(batch))
    journal = _Journal()
    processor = _processor(journal)
    half = len(batches) // 2
    for batch in batches[:half]:
        asyncio.run(processor.handle(batch))
    ended = processor.last_batch["proc-job"]
    assert processor.evict_idle(900.0, now=ended + 899.0) == 0  # not idle long enough
    # a second past (ended + 900 - ended can round to just under 900)
    assert processor.evict_idle(900.0, now=ended + 901.0) == 1
    assert not processor.live and not processor.aligners and not processor.last_batch
    assert processor.commit_floor(("samples", 0)) is None  # all of it is checkpointed
    for batch in batches[half:]:
        asyncio.run(processor.handle(batch))

    def sent(j: _Journal) -> list[tuple[str, str, float]]:
        return [(d["id"], d["state"], d["detected_at"]) for kind, d in j.log
                if kind == "detection"]

    assert sent(journal) == sent(kept) and sent(kept)


def test_with_identity_on_only_proven_samples_reach_the_detectors() -> None:
    """identity.verify: a sample naming a node whose key did not sign it (another
    node's key, none, an unknown key id) is dead-lettered with its reason; the
    node's own signed samples are detected on as before (issue #49)."""
    from vigil_gpu_monitor.contracts.config import IdentityConfig, Secret
    from vigil_gpu_monitor.contracts.identity import Signer, node_key

    master = bytes(range(32))
    cfg = Config(identity=IdentityConfig(verify=True, master_keys=Secret(f"k1={master.hex()}")))
    journal = _Journal()
    processor = BatchProcessor(cfg, WorkerMetrics(), journal, journal, "test-worker")
    forger = Signer("k1", node_key(master, "p0"))  # p0 holds its own key only
    reasons = {}
    for batch in _batches():
        for event in batch:
            node = json.loads(event.value)["node"]
            if node == "p1":  # p0 speaks for p1, whose GPU 2 is slow
                headers = forger.headers(event.value)
            elif node == "p3":
                headers = []
            else:
                headers = Signer("k1", node_key(master, node)).headers(event.value)
            event.message.headers = headers  # type: ignore[attr-defined]
        asyncio.run(processor.handle(batch))
    for kind, value in journal.log:
        if kind == "deadletter":
            record = json.loads(value)
            reasons[record["reason"]] = reasons.get(record["reason"], 0) + 1
    assert set(reasons) == {"bad_signature", "unsigned"} and processor.deadletters == sum(
        reasons.values()) and processor.samples == 150 * 4 - processor.deadletters
    assert not any(k == "detection" and d["node"] in ("p1", "p3") for k, d in journal.log)
