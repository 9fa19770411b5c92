"""A job's detection split over stage-1 shards and a stage 2 decides what one stage
decides (issue #46, docs/sharding.md): the same detections, in the same order."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.contracts.shards import shard_count, shard_key, shard_of, split_key
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardedJob
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.evaluation.scenarios import suite
from vigil_gpu_monitor.vigil.evaluation.shardcheck import compare

START = 1_800_000_000.0


def _faulty(nodes: int = 6, seconds: float = 150.0) -> Iterator[Sample]:
    """A job with a slow GPU, an XID, a thermal GPU, a silent node and a clock 30 s
    ahead; skewed clocks, lost and reordered samples."""
    names = [f"n-{i:02d}" for i in range(nodes)]
    at = START + 40
    faults = [Fault("slow_gpu", "big", names[0], "1", at), Fault("xid", "big", names[1], "2", at),
              Fault("thermal", "big", names[2], "5", at),
              Fault("node_silent", "big", names[3], None, at + 30)]
    cluster = Cluster([JobSpec("big", names)], faults, skew_seconds=1.0, loss=0.01,
                      reorder_seconds=2.0, offsets={names[4]: 30.0})
    return Simulator(cluster, START, seed=5).samples(seconds)


def test_shards_find_what_one_stage_finds_in_the_same_order() -> None:
    one_seconds, outcomes = compare(lambda: _faulty(), (2, 4), evidence=True)
    for o in outcomes:
        assert o.one >= 4, "the faults must be found (or the test compares nothing)"
        assert o.equal, (o.shards, o.only_one, o.only_sharded)
        assert o.same_order
        assert o.late_sharded == o.late_one


@pytest.mark.parametrize("name", ["xid", "node_silent", "slow_node", "hang", "gpu_lost", "thermal"])
def test_a_scenario_of_the_suite_is_equal_at_2_and_4_shards(name: str) -> None:
    sc = next(s for s in suite(sizes=(4,), seeds=(3,)) if s.name.endswith(name))
    _, outcomes = compare(lambda: Simulator(sc.cluster, sc.start, seed=sc.seed).samples(
        sc.duration), (2, 4))
    for o in outcomes:
        assert o.one >= 1 and o.equal and o.same_order, (sc.name, o)


def test_a_shard_whose_nodes_all_fall_silent_does_not_stall_the_job() -> None:
    """One node alone in its shard stops: the job's watermark (stage 2's) still seals
    its shard's bins, and stage 2 finds it silent, as one stage does."""
    names = ["a-0", "a-1", "a-4", "a-5"]
    cluster = Cluster([JobSpec("job", names)],
                      [Fault("node_silent", "job", names[0], None, START + 40)])
    shards = 4
    assert len({shard_of(n, shards) for n in names}) == shards  # each node its own shard
    job = ShardedJob("job", shards, DetectConfig())
    found = [d for s in Simulator(cluster, START, seed=1).samples(120) for d in job.feed(s)]
    assert [(d["kind"], d["node"]) for d in found if d["state"] == "firing"] == [
        ("node_silent", names[0])]
    sealed = job.stage2.engine.next_bin
    assert sealed is not None and sealed * 5.0 > START + 100


def test_the_shard_of_a_node_is_stable_and_spreads() -> None:
    assert shard_of("node-00042", 8) == 2684341995 % 8 == shard_of("node-00042", 8)
    assert shard_of("anything", 1) == 0
    counts = [0] * 16
    for i in range(16 * 512):
        counts[shard_of(f"node-{i:05d}", 16)] += 1
    assert min(counts) > 400 and max(counts) < 620
    assert shard_count(1024, 1024) == 1 and shard_count(1025, 1024) == 2
    assert shard_count(16384, 1024) == 16 and shard_count(0, 1024) == 1
    assert shard_key("llm-7", "node-00042", 1) == "llm-7"
    assert shard_key("llm-7", "node-00042", 8) == f"llm-7#{shard_of('node-00042', 8)}/8"
    assert split_key(shard_key("llm-7", "node-00042", 8)) == (
        "llm-7", shard_of("node-00042", 8), 8)
    assert split_key("llm-7") == ("llm-7", 0, 1)
    for odd in ("llm-7#", "llm-7#3", "llm-7#8/8", "llm-7#x/8", "llm-7#1/99999"):
        assert split_key(odd) == (odd, 0, 1)  # read whole: no job is named so
    with pytest.raises(ValueError):
        shard_count(10, 0)


def test_shard_nodes_out_of_range_is_refused_with_the_setting_named(tmp_path: Any) -> None:
    from vigil_gpu_monitor.contracts.config import load
    from vigil_gpu_monitor.contracts.errors import ConfigError

    path = tmp_path / "vigil.toml"
    path.write_text("[detect]\nshard_nodes = 3\n")
    with pytest.raises(ConfigError, match="detect.shard_nodes"):
        load(path, env={})


def test_a_summary_keeps_the_health_of_its_bin_when_later_samples_change_it() -> None:
    """Stage 1 sends a batch's summaries after folding the whole batch: a summary
    built before an XID's sample must not carry the XID (found over Kafka: stage 2
    fired it a bin early)."""
    from vigil_gpu_monitor.detectors.shard import ShardEngine

    names = ["x-0", "x-1", "x-2"]
    cluster = Cluster([JobSpec("x", names)], [Fault("xid", "x", names[1], "2", START + 60)])
    shard = ShardEngine("x", 0, 1, DetectConfig())
    held = []
    for sample in Simulator(cluster, START, seed=3).samples(90):
        shard.ingest(sample)
        held.extend(shard.seal_closed())  # kept, as a batch keeps them, not sent yet
    before = [s for s in held if s["bin"] is not None and (s["bin"] + 1) * 5.0 < START + 55]
    assert before
    for summary in before:
        for state in summary["health"].values():
            assert all("event" not in g for g in state["gpus"].values())


def test_the_agent_keys_a_sharded_job_by_shard_and_a_small_one_by_job() -> None:
    from vigil_gpu_monitor.producers.publisher import sample_key

    sample: Any = {"job": "llm-7", "node": "node-00042"}
    assert sample_key(sample, None) == b"llm-7"
    assert sample_key(sample, lambda job: 1) == b"llm-7"
    k = shard_of("node-00042", 16)
    assert sample_key(sample, lambda job: 16) == f"llm-7#{k}/16".encode()
    assert sample_key({"job": "", "node": "n"}, lambda job: 16) == b""  # type: ignore[arg-type]


def test_stage_2_shares_a_device_list_and_set_between_bins_of_the_same_devices() -> None:
    """As sealing does: a bin of 131,072 GPUs must not cost a new list and set of
    them each bin (issue #46), and a bin whose devices changed gets its own."""
    job = ShardedJob("big", 2, DetectConfig())
    for s in _faulty(seconds=110.0):
        job.feed(s)
    sealed = job.stage2.engine.window.sealed
    bins = sorted(sealed, key=int)
    assert len(bins) >= 6
    parts = [sealed[b]["g"] for b in bins]
    shared = [(a, b) for a, b in zip(parts, parts[1:], strict=False) if a.devices == b.devices]
    assert shared, "some consecutive bins hold the same devices"
    for a, b in shared:
        assert a.devices is b.devices and a.device_set() is b.device_set()
    for part in parts:
        assert part.device_set() == frozenset(part.devices)  # a changed bin: its own set


def test_a_bin_waiting_for_a_shard_survives_stage_2s_checkpoint() -> None:
    """Rows received for bins another shard has not summarised yet are part of
    stage 2's state: written as JSON (means as base64) and read back, the same
    bytes, and the job goes on to the same detections as without the restart."""
    sent: list[Any] = []
    job = ShardedJob("big", 2, DetectConfig(), lambda s: sent.append(copy.deepcopy(s)) or s)
    for sample in _faulty(seconds=110.0):
        job.feed(sample)
    cut = len(sent) // 2
    early = [s for s in sent[:cut] if not (s["shard"] == 1 and s["bin"] is not None)]
    late = [s for s in sent if s not in early]
    stage = JobStage2("big", 2, DetectConfig())
    before = [d for s in early for d in stage.receive(s) + stage.evaluate_ready()]
    assert any(rows for shards in stage.bins.values() for rows in shards.values())
    state = json.loads(json.dumps(stage.to_state()))
    restored = JobStage2("big", 2, DetectConfig(), state)
    assert restored.bins == stage.bins
    rest = [[d["id"] for s in late for d in st.receive(copy.deepcopy(s)) + st.evaluate_ready()]
            for st in (stage, restored)]
    assert rest[0] == rest[1] and len(before) + len(rest[0]) > 0
    assert restored.engine.next_bin == stage.engine.next_bin
