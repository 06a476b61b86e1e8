"""init_process_group from an init method given on the command line (env:// or tcp://HOST:PORT)
with the rank and world size torchrun's environment gives: each rank contributes a one-hot
vector, and the all-reduced sum must be all ones."""
import argparse
import os
import sys

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-method", "--init_method", required=True)
    parser.add_argument("--world-size", "--world_size", type=int,
                        default=int(os.environ.get("WORLD_SIZE", -1)))
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", -1)))
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method=args.init_method, world_size=args.world_size,
                            rank=args.rank)
    world = dist.get_world_size()
    one_hot = torch.zeros(world, dtype=torch.int64)
    one_hot[dist.get_rank()] = 1
    dist.all_reduce(one_hot)
    if one_hot.tolist() != [1] * world:
        raise RuntimeError(f"all-reduce of one-hot vectors gave {one_hot.tolist()}")
    sys.stdout.write(f"rank {dist.get_rank()} of {world}: init method {args.init_method} works\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
