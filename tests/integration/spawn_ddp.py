"""A DDP script that starts its own processes with torch.multiprocessing.spawn, as the PyTorch
tutorials write it: the parent reads how many to start and spawns one child per rank; each child
sets up the process group itself (gloo, CPU). Under traind it runs as a job with
"launch": "self": the daemon starts this one process per node and gives it MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, LOCAL_WORLD_SIZE (how many to spawn) and NODE_RANK.

Rank 0 prints metric lines on stdout: {"event": "ranks", "seen": [[rank, local_rank, node_rank,
world, CUDA_VISIBLE_DEVICES, pid], ...]} gathered from every rank, then {"event": "train", "step",
"loss"} each step. SPAWN_STEPS sets the steps (default 20); SPAWN_HOLD=1 trains until stopped;
SPAWN_PID_DIR makes each child write its pid there; SPAWN_STUCK=1 makes the children ignore
SIGTERM and SIGINT and, after the first step, block in a sleep: children that neither stop when
told nor notice that their parent and peers are gone (stuck in a system call, or with handlers
of their own)."""
import json
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    # the tutorials hard-code localhost:12355; the daemon's reserved address and port win here
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def train(local_rank, nprocs):
    node_rank = int(os.environ.get("NODE_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", str(nprocs)))
    rank = node_rank * nprocs + local_rank
    stuck = os.environ.get("SPAWN_STUCK") == "1"
    if stuck:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup(rank, world_size)
    pid_dir = os.environ.get("SPAWN_PID_DIR")
    if pid_dir:
        path = os.path.join(pid_dir, f"{rank}.pid")
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
    mine = [rank, local_rank, node_rank, world_size, os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            os.getpid()]
    seen = [None] * world_size
    dist.all_gather_object(seen, mine)
    if rank == 0:
        print(json.dumps({"event": "ranks", "step": 0, "seen": seen}), flush=True)

    torch.manual_seed(0)
    model = DDP(nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 10, generator=g)
    y = x @ (torch.arange(10.0) / 10)
    steps = int(os.environ.get("SPAWN_STEPS", "20"))
    hold = os.environ.get("SPAWN_HOLD") == "1"
    step = 0
    while hold or step < steps:
        loss = ((model(x).squeeze(1) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            print(json.dumps({"event": "train", "step": step, "loss": total.item() / world_size}),
                  flush=True)
        step += 1
        if stuck:
            time.sleep(3600)
        if hold:
            time.sleep(0.1)  # a slow model: the test stops it
    dist.destroy_process_group()


if __name__ == "__main__":
    nprocs = int(os.environ.get("LOCAL_WORLD_SIZE", "2"))
    mp.spawn(train, args=(nprocs,), nprocs=nprocs, join=True)
