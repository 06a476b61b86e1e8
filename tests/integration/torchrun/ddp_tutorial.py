"""PyTorch's "Getting Started with DDP" elastic example as its tutorial runs it under torchrun
(a toy model, DDP, one optimizer step per rank), with gloo on the CPU in place of nccl."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    sys.stdout.write(f"Start running basic DDP example on rank {rank}.\n")  # one write: ranks share stdout
    torch.manual_seed(0)
    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    torch.manual_seed(rank + 1)
    outputs = ddp_model(torch.randn(20, 10))
    loss_fn(outputs, torch.randn(20, 5)).backward()
    optimizer.step()
    # every rank holds the same weights after the step: the gradients were averaged
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    assert all(torch.equal(g, flat) for g in gathered), "ranks disagree after one DDP step"
    sys.stdout.write(f"rank {rank}: finished one DDP step, weights agree\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic()
