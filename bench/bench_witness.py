"""What ``vigil.witness`` costs a training loop per step (issue #47: < 50 µs).

    .venv/bin/python bench/bench_witness.py [--steps 100000]

Three cases, each timed call by call (``perf_counter_ns``), mean, p50, p99 and max:
the default witness beside a live agent receiver (steps held, one datagram a
second); one datagram every step (``flush_seconds=0``: the worst case of a live
agent); and no agent at all (every step's send fails and is counted). The receiver
is polled between calls where a real agent would run on its own core; its cost is
not counted (it is the agent's, not the loop's).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from vigil_gpu_monitor.contracts.messages import StepBatch
from vigil_gpu_monitor.producers.steps import WitnessReceiver
from vigil_gpu_monitor.vigil.witness import Witness


class _Discard:
    def publish_steps(self, batch: StepBatch) -> None:
        pass


def _time(w: Witness, steps: int, receiver: WitnessReceiver | None) -> list[float]:
    out = []
    for i in range(steps):
        began = time.perf_counter_ns()
        w.step(compute=0.8, wall=1.0)
        out.append((time.perf_counter_ns() - began) / 1000)
        if receiver is not None and i % 8 == 0:
            receiver.poll()  # the agent drains its queue, as it would on its own
    return out


def _line(name: str, micros: list[float], w: Witness) -> str:
    q = statistics.quantiles(micros, n=100)
    return (f"{name:28s} mean {statistics.fmean(micros):6.2f} µs  p50 {q[49]:6.2f}  "
            f"p99 {q[98]:6.2f}  max {max(micros):8.1f}  sent {w.sent} dropped {w.dropped} "
            f"errors {w.errors}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "w.sock")
        receiver = WitnessReceiver(path, "bench", _Discard())
        held = Witness(job="j", rank=0, gpu="0", path=path)
        print(_line("agent up, default batching", _time(held, args.steps, receiver), held))
        every = Witness(job="j", rank=0, gpu="0", path=path, flush_seconds=0.0)
        print(_line("agent up, a datagram a step", _time(every, args.steps, receiver), every))
        receiver.close()
        gone = Witness(job="j", rank=0, gpu="0", path=path, flush_seconds=0.0)
        print(_line("no agent, a send a step", _time(gone, args.steps, None), gone))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
