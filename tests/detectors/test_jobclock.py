"""The job's clock fed back from stage 2 to its stage-1 shards (issue #46,
``vigil.jobclock/1``): a shard fed the job's clock corrects what one stage corrects,
stage 2 computes the clock from one bin's summaries of every shard, and a shard whose
nodes all fall silent no longer stalls its job over Kafka."""

from __future__ import annotations

from typing import Any

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.jobclock import decode_jobclock, encode_jobclock
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.contracts.shards import shard_of
from vigil_gpu_monitor.detectors.clocks import MIN_CORRECTION, ClockOffsets
from vigil_gpu_monitor.detectors.engine import ReplayRunner
from vigil_gpu_monitor.detectors.jobclock import FedClockOffsets, JobClockKeeper
from vigil_gpu_monitor.detectors.shard import JobStage2, ShardEngine
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.vigil.evaluation.shardcheck import KafkaModeRunner

START = 1_800_000_000.0


def _sample(node: str, ts: float) -> Sample:
    return {"schema": "vigil.sample/1", "ts": ts, "node": node, "job": "j", "gpus": {},
            "nics": {}}  # type: ignore[typeddict-item]


def _shifts(clocks: ClockOffsets, nodes: list[str]) -> dict[str, float]:
    return {n: clocks.offset[n] - clocks.reference for n in nodes}


def test_a_shard_of_two_nodes_fed_the_jobs_clock_corrects_its_node_as_one_stage() -> None:
    """Eight nodes, one 4 s behind; a shard holds it and one sane node. Alone, the
    shard has no majority and corrects nothing; fed the job's clock, it corrects the
    node behind as one stage does (each by its own vote cadence: within a sampling
    interval of each other), and leaves the sane one alone, also once the node
    behind has fallen silent (the shard's clock runs on with its watermark)."""
    nodes = [f"n{i}" for i in range(8)]
    behind = {"n0": -4.0}
    one = ClockOffsets()
    alone = ClockOffsets()
    fed = FedClockOffsets()

    watermark: list[float] = []
    sealed: dict[int, tuple[float, float]] = {}  # bin → (job clock, watermark) at its seal

    def shard_place(ts_node: str, ts: float) -> float:
        placed, _ = fed.place(_sample(ts_node, ts))
        watermark[:] = [max(watermark + [placed["ts"]])]  # as the engine's max_ts
        return float(placed["ts"])

    for tick in range(120):
        t = START + tick
        if tick == 60:  # n0's next sample, before the others: placed by each
            assert abs(_shifts(one, ["n0"])["n0"]) >= MIN_CORRECTION
            assert fed._voters() == 8 and alone._voters() == 2
            placed_fed = shard_place("n0", t - 4.0)
            placed_one = one.place(_sample("n0", t - 4.0))[0]["ts"]
            placed_alone = alone.place(_sample("n0", t - 4.0))[0]["ts"]
            assert placed_alone == t - 4.0  # no majority: not corrected
            # corrected as in one stage (each by its own vote cadence: within a tick)
            assert placed_one - (t - 4.0) >= MIN_CORRECTION
            assert placed_fed - (t - 4.0) >= MIN_CORRECTION
            assert abs(placed_fed - placed_one) <= 1.01
        for n in nodes:
            if n == "n0" and tick >= 60:
                continue  # n0 falls silent: n1 stays where it is, uncorrected
            ts = t + behind.get(n, 0.0) + 0.01 * (hash(n) % 7)
            one.place(_sample(n, ts))
            if n in ("n0", "n1"):
                alone.place(_sample(n, ts))
                placed = shard_place(n, ts)
                if n == "n1":
                    assert placed == ts, tick
        if tick % 5 == 4:  # the shard seals bin b; stage 2's clock of b - 1 arrives
            b = tick // 5
            latest = sorted(one.latest.values())
            sealed[b] = (latest[3] / 2 + latest[4] / 2, watermark[0])
            fed.remember(b, watermark[0])
            if b - 1 in sealed:
                clock, at = sealed[b - 1]
                fed.take(clock, one.reference, len(latest), at, b - 1)
    restored = FedClockOffsets(fed.to_state())
    # the seals' times are not checkpointed: a restored shard votes alone until it has
    # sealed a bin a job clock is of
    assert restored.fed == fed.fed and restored._voters() == 2


def test_stage2_takes_the_jobs_clock_from_one_bins_summaries_of_every_shard() -> None:
    """Each shard's times are carried to the moment of the job's watermark: shard 0
    sealed bin 10 half a second before shard 1 (its watermark 103.0, shard 1's 103.5)."""
    keeper = JobClockKeeper(2)
    keeper.take(0, 10, {"a": [100.0, 0.5], "b": [101.0, None]}, 103.0)
    keeper.take(1, 10, {"c": [102.0, 1.5]}, 103.5)
    keeper.take(1, 11, {"c": [107.0, 1.5]}, 108.0)  # shard 1 is a bin ahead: it waits
    keeper.settle(10)
    msg = keeper.message("j", 5.0, 11, 103.5)
    assert msg["clock"] == 101.5 and msg["voters"] == 3  # a, b carried by 0.5 s
    assert msg["at"] == 103.5 and msg["bin"] == 10
    assert msg["reference"] is None  # two offsets: no majority
    keeper.take(0, 11, {"a": [105.0, 0.5], "b": [106.0, 0.7]}, 108.0)
    keeper.take(0, 9, {"a": [1.0, 0.0]}, 1.0)  # a restarted shard's old bin: ignored
    keeper.settle(11)
    msg = keeper.message("j", 5.0, 12, 108.0)
    assert msg["clock"] == 106.0 and msg["at"] == 108.0 and msg["bin"] == 11
    assert msg["reference"] == 0.7
    assert decode_jobclock(encode_jobclock(msg)) == msg
    assert JobClockKeeper(2, keeper.to_state()).message("j", 5.0, 12, 108.0) == msg


def _two_shards() -> tuple[list[str], int]:
    names = ["a-0", "a-1", "a-4", "a-5", "a-2", "a-3"]
    shards = 2
    assert {shard_of(n, shards) for n in names} == {0, 1}
    return names, shards


def test_stage2_sends_one_jobclock_a_bin_and_none_for_a_job_of_one_shard() -> None:
    names, shards = _two_shards()
    cfg = DetectConfig()
    engines = {k: ShardEngine("j", k, shards, cfg) for k in range(shards)}
    stage2 = JobStage2("j", shards, cfg)
    single = JobStage2("j", 1, cfg)
    sent = []
    for sample in Simulator(Cluster([JobSpec("j", names)], []), START, seed=1).samples(60):
        shard = engines[shard_of(sample["node"], shards)]
        for summary in shard.ingest(sample) + shard.seal_closed():
            assert summary["bin"] is None or "clocks" in summary
            stage2.receive(summary)
            stage2.evaluate_ready()
            clock = stage2.jobclock_due()
            if clock is not None:
                sent.append(clock)
        assert single.jobclock_due() is None
    bins = [c["next_bin"] for c in sent]
    assert len(sent) >= 8 and len(bins) - len(set(bins)) <= len(set(bins))
    last = sent[-1]
    assert last["voters"] == len(names) and last["at"] is not None
    assert last["max_ts"] is not None and last["max_ts"] > START + 50


def test_a_silent_shard_no_longer_stalls_its_job_over_kafka() -> None:
    """One node alone in its shard falls silent: without the feedback, stage 2 waits
    for its shard for ever; with it, the shard seals its bins by the job's watermark
    and stage 2 finds the node silent at the bin one stage does. Its last sample's
    time (silence is judged on the whole clock offset, no ``MIN_CORRECTION`` step) is
    off by the two offset estimates' difference: milliseconds."""
    names = ["a-0", "a-1", "a-4", "a-5"]
    shards = 4
    assert len({shard_of(n, shards) for n in names}) == shards
    cluster = Cluster([JobSpec("job", names)],
                      [Fault("node_silent", "job", names[0], None, START + 40)])
    samples = list(Simulator(cluster, START, seed=1).samples(150))
    nodes = {"job": set(names)}

    def run(feedback: int | None) -> tuple[list[Any], Any]:
        runner = KafkaModeRunner(DetectConfig(), shards, 20, nodes, feedback)
        found = [d for s in samples for d in runner.feed(s)] + runner.flush()
        return found, runner.stage2["job"].engine.next_bin

    stalled, stalled_at = run(None)
    fed, fed_at = run(8)
    assert stalled == [] and stalled_at * 5.0 < START + 60
    replay = ReplayRunner(DetectConfig())
    one = [d for s in samples for d in replay.feed(s)]
    assert [(d["kind"], d["node"], d["detected_at"]) for d in fed] == [
        (d["kind"], d["node"], d["detected_at"]) for d in one] == [
        ("node_silent", names[0], START + 50)]
    assert abs(fed[0]["started_at"] - one[0]["started_at"]) < 0.05
    assert fed_at * 5.0 > START + 130
