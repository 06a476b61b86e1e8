"""The PyTorch side of bench/recompute.sh: ResNet-18 (CIFAR stem) training steps on synthetic
data, with or without torch.utils.checkpoint around each residual block, printing one JSON line:
the median step time and the process's peak resident memory.

Run with /usr/bin/python3 (Debian's python3-torch) in a fresh process per variant, so the peak
belongs to that variant alone.
"""
import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp

from torch_peer import resnet18_cifar


class Checkpointed(nn.Module):
    """Runs a block under torch.utils.checkpoint: its activations are recomputed in backward."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return cp.checkpoint(self.block, x, use_reentrant=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--checkpoint", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = resnet18_cifar()
    if args.checkpoint:
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            for i in range(len(layer)):
                layer[i] = Checkpointed(layer[i])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))
    times = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step:  # the first step pays for allocation
            times.append(time.perf_counter() - t0)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"step_ms": statistics.median(times) * 1e3, "peak_mb": peak_mb}))


if __name__ == "__main__":
    main()
