"""Which Kafka partition a key goes to: a sharded job's shards on distinct partitions
(issue #46, docs/sharding.md).

Kafka's default partitioner hashes each key (murmur2) modulo the partition count, so
a job's K shard keys ``job#k/K`` land where they fall: two shards of one job share a
partition far more often than not (the 16 shards of a 16-shard job on 16 distinct
partitions of 256 about three times in five; on 16 of 16 about once in a million),
and one stage-1 worker then reads both while another has none of the job. Here a
shard key goes to the partition after its job's own hash by its shard number,
``(murmur2(job) + k) mod P``: a job's shards on K consecutive partitions, distinct
while K <= P, and a job's shards spread over the workers the way the group spreads
partitions. Every other key (a job of one shard, a stage-2 key, a table key of
either) goes where Kafka's default partitioner sends it.

The agents' publisher (kafka-python) and the workers' Faust producer (aiokafka)
take the same function, so stage 1's checkpoint of a shard (its table key is the
shard key, written with the producer's partitioner) lands on the changelog
partition Faust recovers with the samples partition it belongs to. Standard library
only, like the rest of the contract: murmur2 is Kafka's (the Java client's
``Utils.murmur2``), checked against kafka-python's in the tests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from vigil_gpu_monitor.contracts.shards import split_key

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit integer."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    tail = length % 4
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def shard_partition(key: bytes | None, all_partitions: Sequence[int],
                    available: Sequence[int]) -> int:
    """The partition of ``key`` among ``all_partitions`` (the signature both Kafka
    clients call a partitioner with): a shard key's job hash plus its shard number,
    any other key by Kafka's default rule (a key-less message: any available one)."""
    if key is None:
        return random.choice(list(available) or list(all_partitions))
    count = len(all_partitions)
    job, shard, shards = split_key(key.decode("utf-8", errors="replace"))
    if shards > 1:
        return all_partitions[((murmur2(job.encode()) & 0x7FFFFFFF) + shard) % count]
    return all_partitions[(murmur2(key) & 0x7FFFFFFF) % count]
