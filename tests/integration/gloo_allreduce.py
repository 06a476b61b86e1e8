"""An unmodified-style PyTorch DDP check for traind-run: init_process_group("gloo") from the
environment traind-run sets, then an all_reduce. Prints one line per rank."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
expected = world * (world + 1) / 2
assert t.item() == expected, (t.item(), expected)
assert int(os.environ["LOCAL_RANK"]) == rank
print(f"gloo rank {rank} of {world}: sum {t.item():g}", flush=True)
dist.destroy_process_group()
