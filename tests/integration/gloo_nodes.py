"""A PyTorch DDP program as the tutorials write one, for a command job across nodes: the process
group from the torchrun environment (env://, gloo), a torch.nn.Linear in DistributedDataParallel,
a few SGD steps on each rank's own batch, and rank 0 printing metric lines:

- {"event": "env", "step": 0, "vars": {...}}: the torchrun variables this rank was given
- {"event": "train", "step": k, "loss": ..., "world": W}, k = 1..5 (loss averaged over ranks)
- {"event": "sync", "step": 5, "max_param_diff": 0.0}: every rank holds the same weights

With TRAIND_TEST_WAIT set, rank 0 waits after its env line until that file exists (a test holds
two jobs running at once that way); every rank writes its variables to stderr (its log)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

VARS = ["RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE",
        "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"]


def emit(o):
    print(json.dumps(o), flush=True)


def main():
    env = {k: os.environ.get(k) for k in VARS}
    print("gloo_nodes env " + json.dumps(env), file=sys.stderr, flush=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        emit({"event": "env", "step": 0, "vars": env})
        wait = os.environ.get("TRAIND_TEST_WAIT")
        while wait and not os.path.exists(wait):
            time.sleep(0.05)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(1, 6):
        x = torch.randn(16, 8, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            emit({"event": "train", "step": step, "loss": mean.item() / world, "world": world})
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    if rank == 0:
        emit({"event": "sync", "step": 5, "max_param_diff": (hi - lo).abs().max().item()})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
