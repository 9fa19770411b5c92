"""A small transformer training loop: the real GPU load of `bench/real_gpu.sh`.

    python3 bench/gpu_train.py --seconds 600            # train (bf16, one GPU)
    python3 bench/gpu_train.py --seconds 60 --compete   # a second process competing for it

Needs PyTorch and a CUDA GPU (``--device cpu`` runs the same loop, for a dry run).

One GPU stands for one rank of a synchronous job. A rank of a data-parallel job does
its step's work, then waits in the collective for the slowest of its peers: the job's
step time T is common, and the GPU idles for what is left of T. So after a calibration
(``--busy``: the share of T the step's own work takes, measured on the first steps),
every step here starts on a fixed period T, whatever this rank's step took. Under that
pacing the causes of issue #28's table can be made on one GPU, with real counters:

- SIGUSR1 toggles **more work**: the batch grows by ``--more`` (20 %), as on a rank that
  got more tokens than its peers (a hot MoE expert). Busy time and tensor work both rise.
- SIGUSR2 toggles **memory work**: every step adds memory-bound copies sized to
  ``--stall`` (20 %) of the calibrated step, no matrix work. Busy time and
  ``dram_active`` rise, tensor work does not: more work of a memory-bound kind (an
  uneven embedding gather), which moves bytes a stall would not.
- SIGWINCH toggles **a stall**: every step adds a kernel whose warps sit on every SM
  spinning on the clock for ``--stall`` of the calibrated step (as an NCCL kernel waits
  on a slow link, or warps wait on a slow memory), moving no bytes and doing no matrix
  work (CuPy compiles it; without CuPy the toggle is logged and does nothing). Busy time
  rises; tensor work and ``dram_active`` stay level.
- Locked SM clocks (``nvidia-smi -lgc``, from outside) make the same work take longer:
  busy time and ``tensor_active`` rise, ``tensor_active × sm_clock`` stays level.

Every ``--report`` seconds it prints the wall time, the mode, steps/s and the median
time the step's own work took (ms, synchronised): the ground truth the agent's trace
is read against. A step that overruns T starts the next at once (the job slows).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import time
from collections.abc import Callable
from types import FrameType

import torch
from torch import nn

WARMUP_STEPS = 10
CALIBRATION_STEPS = 20


def _model(width: int, layers: int, device: str) -> nn.Module:
    layer = nn.TransformerEncoderLayer(width, nhead=16, dim_feedforward=4 * width,
                                       batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers).to(device)


class Modes:
    """The toggles the schedule sends as signals."""

    SIGNALS = {"more-work": signal.SIGUSR1, "memory-work": signal.SIGUSR2,
               "stall": signal.SIGWINCH}

    def __init__(self) -> None:
        self.on: dict[str, bool] = dict.fromkeys(self.SIGNALS, False)
        by_signal = {int(sig): name for name, sig in self.SIGNALS.items()}

        def toggle(signum: int, frame: FrameType | None) -> None:
            self.on[by_signal[signum]] = not self.on[by_signal[signum]]

        for sig in self.SIGNALS.values():
            signal.signal(sig, toggle)

    def name(self) -> str:
        return "+".join(m for m, on in self.on.items() if on) or "base"


def _spin_kernel() -> Callable[[int], None] | None:
    """A launcher of the stall's kernel (CuPy), or None where CuPy is missing."""
    try:
        import cupy
    except ImportError:
        return None
    kernel = cupy.RawKernel(r"""
    extern "C" __global__ void spin(long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) { }
    }""", "spin")
    blocks = 4 * cupy.cuda.Device(0).attributes.get("MultiProcessorCount", 132)

    def launch(cycles: int) -> None:
        kernel((blocks,), (256,), (cupy.int64(cycles),))
    return launch


class Trainer:
    """The model, its optimiser and one input per batch size."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.device = args.device
        self.model = _model(args.width, args.layers, args.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        bigger = round(args.batch * (1 + args.more))
        self.inputs = {False: torch.randn(args.batch, args.seq, args.width, device=args.device),
                       True: torch.randn(bigger, args.seq, args.width, device=args.device)}
        # the stall's memory-bound pass: 256 MiB copied back and forth
        self.src = torch.empty(64 << 20, device=args.device)
        self.dst = torch.empty_like(self.src)
        self.copies = 0
        self.spin = _spin_kernel() if args.device.startswith("cuda") else None
        self.spin_cycles = 0

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def step(self, on: dict[str, bool]) -> float:
        """One training step (plus the toggles' copies or spin); seconds it took."""
        start = time.monotonic()
        with torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16):
            loss = self.model(self.inputs[on["more-work"]]).float().pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if on["memory-work"]:
            for _ in range(self.copies):
                self.dst.copy_(self.src)
        if on["stall"] and self.spin is not None:
            self.sync()  # the spin waits for the step's kernels, as a collective would
            self.spin(self.spin_cycles)
        self.sync()
        return time.monotonic() - start

    def calibrate(self, stall_share: float) -> float:
        """The median step time, and the copies and spin that make ``stall_share`` of it."""
        base = dict.fromkeys(Modes.SIGNALS, False)
        for _ in range(WARMUP_STEPS):
            self.step(base)
        step = statistics.median(self.step(base) for _ in range(CALIBRATION_STEPS))
        start = time.monotonic()
        for _ in range(10):
            self.dst.copy_(self.src)
        self.sync()
        copy = (time.monotonic() - start) / 10
        self.copies = max(1, round(stall_share * step / copy))
        if self.spin is not None:  # the clock its cycles count at, measured
            self.spin(1_000_000)
            self.sync()
            start = time.monotonic()
            self.spin(20_000_000)
            self.sync()
            self.spin_cycles = int(stall_share * step * 20e6 / (time.monotonic() - start))
        return step


def train(args: argparse.Namespace) -> None:
    """Train on random tokens' embeddings, paced to a common step time, until the end."""
    end = time.monotonic() + args.seconds
    trainer = Trainer(args)
    modes = Modes()
    step = trainer.calibrate(args.stall)
    period = step / args.busy if args.busy < 1 else 0.0
    print(f"{time.time():.0f} calibrated: step {step * 1e3:.1f} ms, period "
          f"{period * 1e3:.1f} ms (busy {args.busy:.0%}), memory work {trainer.copies} "
          f"copies of {trainer.src.numel() * 4 >> 20} MiB, stall "
          f"{f'{trainer.spin_cycles:,} cycles' if trainer.spin else 'unavailable'}",
          flush=True)
    took: list[float] = []
    mark = next_start = time.monotonic()
    while time.monotonic() < end:
        took.append(trainer.step(modes.on))
        next_start += period
        now = time.monotonic()
        if next_start > now:
            time.sleep(next_start - now)
        else:
            next_start = now  # overran the period: the job waits for this rank
        if now - mark >= args.report:
            print(f"{time.time():.0f} mode {modes.name()} steps/s {len(took) / (now - mark):.2f}"
                  f" step_ms {statistics.median(took) * 1e3:.1f}", flush=True)
            took, mark = [], now


def compete(seconds: float, device: str, size: int) -> None:
    """Back-to-back bf16 matrix products: another tenant's kernels on the same GPU."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = (a @ a).clamp_(-1, 1)
        if device.startswith("cuda"):
            torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--compete", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--busy", type=float, default=0.5,
                        help="share of the common step time this rank's work takes (1: no "
                        "pacing, back-to-back steps)")
    parser.add_argument("--more", type=float, default=0.2, help="SIGUSR1's extra batch share")
    parser.add_argument("--stall", type=float, default=0.2,
                        help="SIGUSR2's memory-bound time and SIGWINCH's spin, a share of "
                        "the calibrated step")
    parser.add_argument("--report", type=float, default=5.0, help="seconds between lines")
    args = parser.parse_args()
    if args.compete:
        compete(args.seconds, args.device, 8 * args.width)
    else:
        train(args)


if __name__ == "__main__":
    main()
