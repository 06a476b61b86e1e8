"""A script of torch.distributed.launch's time: it requires --local_rank=N and checks it against
LOCAL_RANK."""
import argparse
import os
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, required=True)
args = parser.parse_args()
if args.local_rank != int(os.environ["LOCAL_RANK"]):
    raise SystemExit(f"--local_rank {args.local_rank} but LOCAL_RANK {os.environ['LOCAL_RANK']}")
sys.stdout.write(f"local rank {args.local_rank} agrees\n")  # one write: ranks share stdout
