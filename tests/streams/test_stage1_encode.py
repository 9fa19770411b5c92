"""Stage 1's summary encoder (msgspec) against the contract's (json.dumps): the same
message once decoded, the same refusals."""

from __future__ import annotations

import copy

import pytest

from vigil_gpu_monitor.contracts.config import DetectConfig
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.messages import Summary
from vigil_gpu_monitor.contracts.summary import decode_summary, encode_summary, split_parts
from vigil_gpu_monitor.detectors.shard import ShardedJob
from vigil_gpu_monitor.simulator.cluster import Cluster, Fault, JobSpec, Simulator
from vigil_gpu_monitor.streams.stage1 import encode_summary_fast

START = 1_800_000_000.0


@pytest.fixture(scope="module")
def summaries() -> list[Summary]:
    """Every summary part of a 4-node job with an XID and a slow GPU, at 2 shards."""
    names = [f"e-{i}" for i in range(4)]
    cluster = Cluster([JobSpec("enc-job", names)],
                      [Fault("xid", "enc-job", names[1], "2", START + 20),
                       Fault("slow_gpu", "enc-job", names[3], "5", START + 10)])
    seen: list[Summary] = []

    def keep(s: Summary) -> Summary:
        seen.extend(copy.deepcopy(p) for p in split_parts(s))
        return s

    job = ShardedJob("enc-job", 2, DetectConfig(), keep)
    for sample in Simulator(cluster, START, seed=4).samples(45):
        job.feed(sample)
    return seen


def test_the_fast_encoder_sends_what_the_contracts_encoder_sends(
        summaries: list[Summary]) -> None:
    assert any(s["events"] for s in summaries) and any(s["nodes"] for s in summaries)
    for s in summaries:
        assert decode_summary(encode_summary_fast(s)) == decode_summary(encode_summary(s))


def test_the_fast_encoder_refuses_what_the_contract_refuses(
        summaries: list[Summary]) -> None:
    bad = copy.deepcopy(next(s for s in summaries if s["nodes"]))
    bad["max_ts"] = float("nan")
    for encode in (encode_summary, encode_summary_fast):
        with pytest.raises(ContractError):
            encode(bad)


def test_an_oversized_part_is_refused_as_the_contract_refuses_it(
        summaries: list[Summary]) -> None:
    big = copy.deepcopy(next(s for s in summaries if s["nodes"]))
    node, rows = next(iter(big["nodes"].items()))
    big["nodes"] = {f"{node}x{i}": rows for i in range(2000)}  # far over 512 KiB
    reasons = []
    for encode in (encode_summary, encode_summary_fast):
        with pytest.raises(ContractError) as refused:
            encode(big)
        reasons.append(refused.value.reason)
    assert reasons[0] == reasons[1]
