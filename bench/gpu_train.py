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
- SIGUSR2 toggles **a stall**: every step adds memory-bound copies sized to ``--stall``
  (20 %) of the calibrated step, no matrix work. Busy time rises, tensor work does not.
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
    """The two toggles the schedule sends as signals."""

    def __init__(self) -> None:
        self.more_work = False
        self.stall = False
        signal.signal(signal.SIGUSR1, self._toggle_work)
        signal.signal(signal.SIGUSR2, self._toggle_stall)

    def _toggle_work(self, signum: int, frame: FrameType | None) -> None:
        self.more_work = not self.more_work

    def _toggle_stall(self, signum: int, frame: FrameType | None) -> None:
        self.stall = not self.stall

    def name(self) -> str:
        return "+".join(m for m, on in (("more-work", self.more_work),
                                        ("stall", self.stall)) if on) or "base"


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

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def step(self, more_work: bool, stall: bool) -> float:
        """One training step (plus the stall's copies); seconds it took, synchronised."""
        start = time.monotonic()
        with torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16):
            loss = self.model(self.inputs[more_work]).float().pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if stall:
            for _ in range(self.copies):
                self.dst.copy_(self.src)
        self.sync()
        return time.monotonic() - start

    def calibrate(self, stall_share: float) -> float:
        """The median step time, and the copies that make ``stall_share`` of it."""
        for _ in range(WARMUP_STEPS):
            self.step(False, False)
        step = statistics.median(self.step(False, False) for _ in range(CALIBRATION_STEPS))
        start = time.monotonic()
        for _ in range(10):
            self.dst.copy_(self.src)
        self.sync()
        copy = (time.monotonic() - start) / 10
        self.copies = max(1, round(stall_share * step / copy))
        return step


def train(args: argparse.Namespace) -> None:
    """Train on random tokens' embeddings, paced to a common step time, until the end."""
    end = time.monotonic() + args.seconds
    trainer = Trainer(args)
    modes = Modes()
    step = trainer.calibrate(args.stall)
    period = step / args.busy if args.busy < 1 else 0.0
    print(f"{time.time():.0f} calibrated: step {step * 1e3:.1f} ms, period "
          f"{period * 1e3:.1f} ms (busy {args.busy:.0%}), stall {trainer.copies} copies of "
          f"{trainer.src.numel() * 4 >> 20} MiB", flush=True)
    took: list[float] = []
    mark = next_start = time.monotonic()
    while time.monotonic() < end:
        took.append(trainer.step(modes.more_work, modes.stall))
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
                        help="SIGUSR2's memory-bound time, a share of the calibrated step")
    parser.add_argument("--report", type=float, default=5.0, help="seconds between lines")
    args = parser.parse_args()
    if args.compete:
        compete(args.seconds, args.device, 8 * args.width)
    else:
        train(args)


if __name__ == "__main__":
    main()
