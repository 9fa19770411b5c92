"""The cost of proving a sample's node (issue #49): sign in the agent, verify in the
worker, per node-sample, and the worker's batch processing with verification on and
off over the same samples.

    .venv/bin/python bench/bench_identity.py [--nodes 256] [--seconds 150] [--rounds 3]

The samples are `bench_worker.py`'s (jobs of 8 nodes of 8 GPUs, our simulator's seed
1). ``per sample`` times, best of ``--rounds``: ``encode_sample`` (what the agent
already does per sample), ``Signer.headers`` (its HMAC-SHA256 over the value bytes),
``decode_sample_fast`` (what the worker already does), ``Verifier.check`` with the
node's key cached (the steady state) and with a fresh derivation (a node's first
sample since the worker started). ``processor`` runs ``BatchProcessor.handle``
(decode, verify, window, detect; no Kafka) in batches of 500, verification off and on
alternately, and reports node-samples/s of each. Times are the process's CPU time
(``time.process_time``), not wall time: on a shared machine the wall clock also
counts the time other processes held the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_worker import START, _cluster

from vigil_gpu_monitor.contracts.codec import encode_sample
from vigil_gpu_monitor.contracts.config import Config, IdentityConfig, Secret
from vigil_gpu_monitor.contracts.identity import Signer, Verifier, node_key
from vigil_gpu_monitor.contracts.messages import Sample
from vigil_gpu_monitor.simulator.cluster import Simulator
from vigil_gpu_monitor.streams.decode import decode_sample_fast
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.streams.processor import BatchProcessor

MASTER = bytes(range(32))
BATCH = 500


@dataclass
class _Message:
    key: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: float | None
    headers: Any


@dataclass
class _Event:
    value: bytes
    message: _Message


class _Sink:
    async def detection(self, key: bytes, value: bytes, headers: dict[str, bytes]) -> None:
        pass

    async def deadletter(self, key: bytes | None, value: bytes) -> None:
        raise AssertionError("a signed sample was refused")


def _best(fn: Callable[[], None], n: int, rounds: int) -> float:
    """Best of ``rounds`` runs of ``fn`` (over ``n`` items): µs per item."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def per_sample(samples: list[Sample], values: list[bytes], rounds: int) -> None:
    signers = {s["node"]: Signer("k1", node_key(MASTER, s["node"])) for s in samples}
    pairs = [(s["node"], v, signers[s["node"]]) for s, v in zip(samples, values, strict=True)]
    headers = [signer.headers(v) for _, v, signer in pairs]
    warm = Verifier({"k1": MASTER})
    for (node, value, _), h in zip(pairs, headers, strict=True):
        warm.check(node, value, h)
    n = len(values)

    def cold() -> None:
        for (node, value, _), h in zip(pairs, headers, strict=True):
            Verifier({"k1": MASTER}).check(node, value, h)

    def sign() -> None:
        for _, value, sg in pairs:
            sg.headers(value)

    def check_warm() -> None:
        for (node, value, _), h in zip(pairs, headers, strict=True):
            warm.check(node, value, h)

    rows = [
        ("agent: encode_sample (already done)",
         _best(lambda: [encode_sample(s) for s in samples], n, rounds)),
        ("agent: Signer.headers (HMAC of the value)", _best(sign, n, rounds)),
        ("worker: decode_sample_fast (already done)",
         _best(lambda: [decode_sample_fast(v) for v in values], n, rounds)),
        ("worker: Verifier.check, node key cached", _best(check_warm, n, rounds)),
        ("worker: Verifier.check, key derived (first sample)", _best(cold, n, rounds)),
    ]
    size = sum(map(len, values)) / n
    print(f"{n} node-samples of {size:,.0f} bytes on average")
    for name, micros in rows:
        print(f"  {name:<52} {micros:7.2f} µs")


def processor(samples: list[Sample], values: list[bytes], rounds: int) -> None:
    signers = {s["node"]: Signer("k1", node_key(MASTER, s["node"])) for s in samples}
    events = [_Event(v, _Message(s["job"].encode(), "samples", 0, i, None,
                                 signers[s["node"]].headers(v)))
              for i, (s, v) in enumerate(zip(samples, values, strict=True))]
    keys = Secret(f"k1={MASTER.hex()}")
    results: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode in ("off", "on"):
            cfg = Config(identity=IdentityConfig(verify=mode == "on", master_keys=keys))
            proc = BatchProcessor(cfg, WorkerMetrics(), _Sink(), {}, "bench")

            async def run(p: BatchProcessor = proc) -> None:
                for i in range(0, len(events), BATCH):
                    await p.handle(events[i:i + BATCH])

            t0 = time.process_time()
            asyncio.run(run())
            results[mode].append(len(events) / (time.process_time() - t0))
    for mode, rates in results.items():
        print(f"  processor, verification {mode:<3}: "
              f"{', '.join(f'{r:,.0f}' for r in rates)} node-samples/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    samples = list(Simulator(_cluster(args.nodes), START, seed=1).samples(args.seconds))
    values = [encode_sample(s) for s in samples]
    per_sample(samples, values, args.rounds)
    processor(samples, values, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
