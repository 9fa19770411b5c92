"""Which shard of its job a node's samples belong to (issue #46, docs/sharding.md).

A job of more than ``detect.shard_nodes`` nodes is split into stable groups of its
nodes, the shards: stage 1 of the detection is keyed by (job, shard), stage 2 by the
job. The node agent, both stages and ``vigil replay --shards`` must compute the same
shard for a node, so the rule lives here, in the standard library only: ``crc32`` of
the node name (stable across processes and Python versions, unlike ``hash``) modulo
the shard count, and the count ``ceil(nodes / shard_nodes)``. A job of one shard
keeps today's key, the job id: small jobs stay on the one-stage path; a
sharded job's samples are keyed ``job#k/K``.
"""

from __future__ import annotations

import math
import zlib

SHARD_SEPARATOR = "#"  # the samples key of a shard: "<job>#<k>/<K>" (job ids never hold #)
MIN_SHARD_NODES = 16
MAX_SHARD_NODES = 16384
MAX_SHARDS = 4096


def shard_count(nodes: int, shard_nodes: int) -> int:
    """How many shards a job of ``nodes`` nodes is split into (1: not split)."""
    if shard_nodes < 1:
        raise ValueError(f"shard_nodes must be at least 1, not {shard_nodes}")
    return min(MAX_SHARDS, max(1, math.ceil(nodes / shard_nodes)))


def shard_of(node: str, shards: int) -> int:
    """The shard of ``node`` in a job of ``shards`` shards (0 when not split)."""
    if shards <= 1:
        return 0
    return zlib.crc32(node.encode()) % shards


def shard_key(job: str, node: str, shards: int) -> str:
    """The samples key a node's sample is sent under: the job id, or ``job#k/K``
    (stage 1 reads the shard and the job's shard count from it)."""
    if shards <= 1:
        return job
    return f"{job}{SHARD_SEPARATOR}{shard_of(node, shards)}/{shards}"


def split_key(key: str) -> tuple[str, int, int]:
    """(job, shard, shards) of a samples key; a plain job id is shard 0 of 1. A key
    whose shard part does not read as ``k/K`` with 0 <= k < K <= MAX_SHARDS is taken
    whole as a job id (which the sample's own job then fails to match)."""
    job, sep, rest = key.rpartition(SHARD_SEPARATOR)
    k, slash, count = rest.partition("/")
    if not sep or not slash or not k.isdigit() or not count.isdigit():
        return key, 0, 1
    shard, shards = int(k), int(count)
    if not 0 <= shard < shards <= MAX_SHARDS:
        return key, 0, 1
    return job, shard, shards
