"""The agents' and workers' partitioner (``contracts/partition.py``): a sharded
job's shards on distinct partitions, every other key where Kafka's default
partitioner sends it (issue #46)."""

from __future__ import annotations

import random
from typing import Any

from aiokafka.partitioner import DefaultPartitioner as AiokafkaDefault
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from vigil_gpu_monitor.contracts.partition import murmur2, shard_partition
from vigil_gpu_monitor.contracts.shards import shard_key
from vigil_gpu_monitor.producers.publisher import ShardPartitioner


def test_murmur2_is_kafkas() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 48)))
        assert murmur2(data) & 0x7FFFFFFF == kafka_python_murmur2(data) & 0x7FFFFFFF
    assert murmur2(b"") & 0x7FFFFFFF == kafka_python_murmur2(b"") & 0x7FFFFFFF


def test_a_key_that_is_not_a_shards_goes_where_kafkas_default_sends_it() -> None:
    rng = random.Random(8)
    aiokafka_default = AiokafkaDefault()
    for i in range(1000):
        parts = list(range(rng.choice((1, 3, 8, 16, 64, 256))))
        key = rng.choice((f"job-{i}", f"train.{i}#x", f"j{i}#3/1", f"{i}")).encode()
        assert shard_partition(key, parts, parts) == aiokafka_default(key, parts, parts)


def test_a_jobs_shards_land_on_distinct_consecutive_partitions() -> None:
    for partitions in (16, 64, 256):
        parts = list(range(partitions))
        for j in range(200):
            shards = 16
            nodes = [f"n{i:05d}" for i in range(shards * 40)]
            keys = {shard_key(f"train-{j}", n, shards).encode() for n in nodes}
            assert len(keys) == shards
            got = sorted(shard_partition(k, parts, parts) for k in keys)
            assert len(set(got)) == shards, (partitions, j, got)
            base = (murmur2(f"train-{j}".encode()) & 0x7FFFFFFF) % partitions
            assert set(got) == {(base + k) % partitions for k in range(shards)}
    # the default hash of the same keys shares partitions: what this is for
    shared = 0
    for j in range(200):
        keys = {shard_key(f"train-{j}", f"n{i:05d}", 16).encode() for i in range(640)}
        shared += len({AiokafkaDefault()(k, list(range(64)), list(range(64)))
                       for k in keys}) < 16
    assert shared > 100


def test_a_message_without_a_key_goes_to_an_available_partition() -> None:
    for _ in range(50):
        assert shard_partition(None, [0, 1, 2, 3], [2, 3]) in (2, 3)
    assert shard_partition(None, [0, 1], []) in (0, 1)


class _Cluster:
    def topics(self) -> set[str]:
        return {"t"}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(8))

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(8))


def test_the_agents_kafka_python_partitioner_is_the_same_rule() -> None:
    cluster: Any = _Cluster()
    partitioner = ShardPartitioner()
    for i in range(100):
        key = shard_key("job", f"node-{i}", 4).encode()
        assert partitioner.partition("t", None, key, None, None, cluster) == \
            shard_partition(key, list(range(8)), list(range(8)))
