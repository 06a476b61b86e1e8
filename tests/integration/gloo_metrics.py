"""A small PyTorch DDP (gloo) program for traind's command jobs: init_process_group("gloo") from the
torchrun environment the daemon sets, a few steps of "training" a torch.nn.Linear wrapped in
DistributedDataParallel, and rank 0 printing metric lines ({"event": ...}) on stdout, as
daemon_test.py expects:

- {"event": "env", "step": 0, ...}: the torchrun variables it was given, its cwd and TRAIND_TEST_MARK
- {"event": "train", "step": k, "loss": ..., "world": 2}, k = 1..STEPS (loss averaged over ranks)
- {"event": "sync", "step": STEPS, "max_param_diff": 0.0}: DDP kept the replicas identical
- {"event": "done", "step": STEPS, "loss": ...}

Rank 0 also prints lines that are not metrics (plain text, JSON without "event", a JSON array);
rank 1 prints a JSON line with an "event" (only rank 0's count) and a marker line for its log."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 5
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def emit(obj):
    print(json.dumps(obj), flush=True)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    assert int(os.environ["LOCAL_RANK"]) == rank, os.environ["LOCAL_RANK"]

    if rank == 0:
        emit({"event": "env", "step": 0, "cwd": os.getcwd(),
              "vars": {k: os.environ.get(k) for k in TORCHRUN_VARS},
              "mark": os.environ.get("TRAIND_TEST_MARK")})
        print("gloo_metrics: plain text on stdout is not a metric", flush=True)
        emit({"no_event": 1, "step": 1})
        emit([1, 2, 3])
    else:
        emit({"event": "rank1_noise", "step": 3})  # rank 1's events are not metrics
        print(f"gloo_metrics rank {rank} stdout marker", flush=True)
    print(f"gloo_metrics rank {rank} of {world} starting", file=sys.stderr, flush=True)

    torch.manual_seed(0)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    loss = torch.zeros(())
    for step in range(1, STEPS + 1):
        x = torch.randn(16, 4, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if rank == 0:
            emit({"event": "train", "step": step, "loss": mean.item(), "world": world})

    # DDP keeps the replicas identical: the largest difference from rank 0's weights is 0
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    diff = torch.tensor([(flat - ref).abs().max().item()])
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        emit({"event": "sync", "step": STEPS, "max_param_diff": diff.item()})
        emit({"event": "done", "step": STEPS, "loss": loss.item()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
