"""A small transformer training loop: the real GPU load of `bench/real_gpu.sh`.

    python3 bench/gpu_train.py --seconds 600            # train (bf16, one GPU)
    python3 bench/gpu_train.py --seconds 60 --compete   # a second process competing for it

Needs PyTorch and a CUDA GPU. Prints one line every 10 s (steps/s), so the log shows
the step rate the real changes of the run (power cap, locked clocks, a competitor,
a pause) caused: the ground truth the agent's trace is read against.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


def _model(width: int, layers: int) -> nn.Module:
    layer = nn.TransformerEncoderLayer(width, nhead=16, dim_feedforward=4 * width,
                                       batch_first=True, norm_first=True)
    return nn.TransformerEncoder(layer, layers).cuda()


def train(seconds: float, width: int, layers: int, batch: int, seq: int) -> None:
    """Train on random tokens' embeddings until ``seconds`` have passed."""
    model = _model(width, layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, seq, width, device="cuda")
    end = time.monotonic() + seconds
    steps, mark = 0, time.monotonic()
    while time.monotonic() < end:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps % 20 == 0:
            torch.cuda.synchronize()
            now = time.monotonic()
            if now - mark >= 10:
                print(f"{time.time():.0f} steps/s {steps / (now - mark):.2f}", flush=True)
                steps, mark = 0, now


def compete(seconds: float) -> None:
    """Back-to-back bf16 matrix products: another tenant's kernels on the same GPU."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--compete", action="store_true")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    args = parser.parse_args()
    if args.compete:
        compete(args.seconds)
    else:
        train(args.seconds, args.width, args.layers, args.batch, args.seq)


if __name__ == "__main__":
    main()
