"""PyTorch DDP (gloo) LeNet-5 for bench/ddp.sh, run under traind-run (or torchrun): each rank
trains on its own synthetic batches; rank 0 prints the total img/s over all ranks."""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_peer import LeNet5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(LeNet5())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    pool = [(torch.rand(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,)))
            for _ in range(8)]

    def step(i):
        x, y = pool[i % len(pool)]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for i in range(20):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
    dist.barrier()
    dt = time.perf_counter() - t0
    if dist.get_rank() == 0:
        print(json.dumps({"impl": "pytorch-ddp-gloo", "world": world,
                          "img_per_s": world * args.steps * args.batch / dt}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
