"""A PyTorch DDP script written for the legacy launcher (python -m torch.distributed.launch): it
takes its local rank from --local_rank (or --local-rank) on its command line, as the launcher
passed it, and the rest from the environment. Rank 0 prints one metric line:
{"event": "ranks", "step": 0, "seen": [[local_rank, rank, world], ...]} gathered from every
rank, so the test sees what each process was given."""
import argparse
import json

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, default=-1)
args = parser.parse_args()
dist.init_process_group("gloo")
mine = torch.tensor([args.local_rank, dist.get_rank(), dist.get_world_size()])
seen = [torch.zeros(3, dtype=mine.dtype) for _ in range(dist.get_world_size())]
dist.all_gather(seen, mine)
if dist.get_rank() == 0:
    print(json.dumps({"event": "ranks", "step": 0, "seen": [s.tolist() for s in seen]}),
          flush=True)
dist.destroy_process_group()
